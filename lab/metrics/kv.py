"""KV-cache figures from engine samples.

vLLM: usage = 1 - free_blocks / total_blocks, as vLLM's block pool defines it (read from its
SchedulerStats, never recomputed); used blocks = usage x total.
HF: reserved = bytes its static batch's contiguous cache holds (batch x padded length x bytes/token; a static
cache's rows x their reserved length), real = the part holding running requests' own prompt and output tokens;
waste = 1 - real / reserved, split by kind in the vLLM paper's terms (``kinds_series``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from lab.engines import registry
from lab.engines.base import EngineSample
from lab.load.driver import RequestRecord


def used_blocks(sample: EngineSample) -> int | None:
    """vLLM blocks in use at the sample."""
    if sample.kv_usage is None or sample.kv_total_blocks is None:
        return None
    return round(sample.kv_usage * sample.kv_total_blocks)


def kv_summary(samples: Sequence[EngineSample], num_blocks: int | None = None,
               block_size: int | None = None) -> dict:
    """Peak KV figures of one engine over one level.

    Args:
        samples: The engine's samples during the level.
        num_blocks: vLLM's total KV blocks (from start-up), if known.
        block_size: Tokens per vLLM block.

    Returns:
        For vLLM: num_blocks, block_size, peak_usage (None when no read saw a request running: a
        server's /metrics read only before and after the level's requests says nothing of their blocks),
        peak_used_blocks, preemptions, prefix-cache queries and hits during the level. For HF:
        peak_reserved_bytes, peak_real_bytes and waste_at_peak (share of the reserved cache not holding
        real tokens at the peak).
    """
    vllm = [s for s in samples if s.kv_usage is not None]
    if vllm or num_blocks is not None:  # a pool whose usage could not be read has peak None, not 0
        peak = max((s.kv_usage for s in vllm if s.running), default=None)  # only reads that saw a request run
        first, last = (vllm[0], vllm[-1]) if vllm else (None, None)
        return {
            "num_blocks": num_blocks, "block_size": block_size, "peak_usage": peak,
            "peak_used_blocks": round(peak * num_blocks) if num_blocks and peak is not None else None,
            "preemptions": (last.preemptions_total - first.preemptions_total) if vllm else None,  # None: no read
            "prefix_cache_queries": sum(s.prefix_queries for s in vllm),  # each sample's own: the first's counts too
            "prefix_cache_hits": sum(s.prefix_hits for s in vllm),
        }
    hf = [s for s in samples if s.kv_reserved_bytes is not None]
    if not hf:
        return {}
    peak = max(hf, key=lambda s: s.kv_reserved_bytes)
    waste = 1 - peak.kv_real_bytes / peak.kv_reserved_bytes if peak.kv_reserved_bytes else 0.0
    return {
        "peak_reserved_bytes": peak.kv_reserved_bytes,
        "peak_real_bytes": max(s.kv_real_bytes for s in hf),
        "waste_at_peak": waste,
    }


# -- memory waste over time (the "waste" and "blocks" experiments) ---------------------------------

def tokens_held(record: RequestRecord, time_s: float) -> int:
    """KV tokens a request holds at ``time_s``, as seen from its token arrivals: its prompt plus the
    output tokens that arrived before then, from its first token until it ended (0 otherwise: still
    waiting or in its first step, or done)."""
    if record.first_token_s is None or time_s <= record.first_token_s:
        return 0
    if record.end_s is not None and record.end_s < time_s:
        return 0
    return record.prompt_tokens + sum(1 for t in record.token_times_s if t < time_s)


def blocks_for(tokens: int, block_size: int, requests: int = 1) -> int:
    """Blocks that ``requests`` requests of ``tokens`` KV entries each hold: a partly filled last block counts
    whole (vLLM's rule)."""
    return requests * -(-tokens // block_size)


def empty_slots(tokens: int, block_size: int) -> int:
    """Token slots left empty in the last block of a request of ``tokens`` entries (its share of the waste)."""
    return blocks_for(tokens, block_size) * block_size - tokens


def blocks_held(record: RequestRecord, time_s: float, block_size: int) -> int:
    """vLLM blocks a request's tokens fill at ``time_s``."""
    return blocks_for(tokens_held(record, time_s), block_size)


def vllm_usage_series(samples: Sequence[EngineSample], records: Sequence[RequestRecord]) -> list[tuple]:
    """(time, allocated tokens, real tokens, used blocks, derived blocks, running) at every vLLM sample.

    Allocated = vLLM's used blocks (kv_usage x total, its own statistic) x block size; real = the tokens
    the requests hold after that engine step; derived blocks = those tokens cut into blocks per request,
    the picture the "blocks" experiment draws and checks against vLLM's count. A step's statistics reach
    the lab just before its tokens do, so a step's tokens are those that arrived before the next sample.
    """
    rows = []
    usable = [s for s in samples if used_blocks(s) is not None and s.kv_block_size]
    nexts = [s.time_s for s in usable[1:]] + [float("inf")] * bool(usable)
    holding = _Holding(records)
    for s, after in zip(usable, nexts, strict=True):
        held = holding.at(after)
        derived = sum(blocks_for(tokens, s.kv_block_size) for tokens in held)
        rows.append((s.time_s, used_blocks(s) * s.kv_block_size, sum(held), used_blocks(s), derived, s.running))
    return rows


class _Holding:
    """tokens_held of every request holding KV at a time, for times asked in order: one sweep over the
    requests by first token, so a series costs the requests in flight at each sample, not every request
    and token of the level at every sample (a GPU makes a sample every few milliseconds)."""

    def __init__(self, records: Sequence[RequestRecord]):
        self.by_first = sorted((r for r in records if r.first_token_s is not None), key=lambda r: r.first_token_s)
        self.active, self.joined, self.last = [], 0, float("-inf")

    def at(self, time_s: float) -> list[int]:
        """The tokens each request holding KV at ``time_s`` holds (requests not started or ended then left out)."""
        if time_s < self.last:  # asked out of order: sweep again from the start
            self.active, self.joined = [], 0
        while self.joined < len(self.by_first) and self.by_first[self.joined].first_token_s < time_s:
            self.active.append(self.by_first[self.joined])
            self.joined += 1
        self.active = [r for r in self.active if r.end_s is None or r.end_s >= time_s]
        self.last = time_s
        return [r.prompt_tokens + bisect.bisect_left(r.token_times_s, time_s) for r in self.active]


def hf_usage_series(samples: Sequence[EngineSample], bytes_per_token: int) -> list[tuple]:
    """(time, reserved tokens, real tokens) at every HF sample (bytes / bytes per token)."""
    return [(s.time_s, s.kv_reserved_bytes // bytes_per_token, s.kv_real_bytes // bytes_per_token)
            for s in samples if s.kv_reserved_bytes is not None]


def held_series(engine: str, samples: Sequence[EngineSample], records: Sequence[RequestRecord],
                bytes_per_token: int | None) -> list[tuple]:
    """(time, held tokens, real tokens, ...) of one engine's level: vLLM's from its blocks
    (vllm_usage_series), HF's from its bytes (hf_usage_series; none without its bytes per token). A server
    whose /metrics gave block usage counts as paged."""
    if registry.spec(engine).paged or any(s.kv_usage is not None for s in samples):  # blocks: vLLM's own statistic
        return vllm_usage_series(samples, records)
    return hf_usage_series(samples, bytes_per_token) if bytes_per_token else []


def waste_stats(series: Sequence[tuple]) -> dict:
    """Waste of a (time, held, real, ...) series: at the peak of what was held, and time-weighted.

    peak: 1 - real / held at the sample where the engine held the most memory (a moment's share, not the highest
    waste), floored at 0; peak_counted_over: the requests' tokens counted then exceeded what the engine held, so the
    moment's waste is not known (token arrivals and the engine's counts are read at different instants).
    mean: 1 - (integral of real) / (integral of held) over the series, each sample holding until the next
    (so it is the share of memory x time that held no real token).
    """
    held_rows = [row for row in series if row[1] > 0]
    if not held_rows:
        return {"peak": None, "mean": None, "peak_held_tokens": 0}
    top = max(held_rows, key=lambda row: row[1])
    held = real = 0.0
    for row, nxt in itertools.pairwise(series):
        dt = nxt[0] - row[0]
        held, real = held + row[1] * dt, real + min(row[2], row[1]) * dt
    return {"peak": max(0.0, 1 - top[2] / top[1]), "mean": (1 - real / held) if held else None,
            "peak_held_tokens": top[1], "peak_counted_over": top[2] > top[1]}


KINDS = ("real", "reservation", "internal", "external")  # what held KV slots hold, in the vLLM paper's terms


def kinds_series(engine: str, samples: Sequence[EngineSample], records: Sequence[RequestRecord],
                 bytes_per_token: int | None) -> list[tuple]:
    """(time, held, real, reservation, internal, external) tokens at every sample of one engine's level.

    HF's from the slots of its batch (EngineSample's kind fields). A paged engine's from its blocks: what its
    used blocks hold beyond the requests' tokens is internal fragmentation (each last block's empty tail); it has
    no reservation and no external fragmentation by design (a block is taken when a token needs it, and any free
    block serves any request).
    """
    if registry.spec(engine).paged or any(s.kv_usage is not None for s in samples):
        rows = [(t, held, min(real, held)) for t, held, real, *_ in vllm_usage_series(samples, records)]
        return [(t, held, real, 0, held - real, 0) for t, held, real in rows]
    if not bytes_per_token:
        return []
    return [(s.time_s, *(v // bytes_per_token for v in _hf_kinds(s))) for s in samples
            if s.kv_reserved_bytes is not None]


def _hf_kinds(s: EngineSample) -> tuple[int, ...]:
    """held, real, reservation, internal, external bytes of an HF sample (one without kinds: all waste internal)."""
    internal = s.kv_internal_bytes if s.kv_internal_bytes is not None else s.kv_reserved_bytes - s.kv_real_bytes
    return (s.kv_reserved_bytes, s.kv_real_bytes, s.kv_reservation_bytes or 0, internal, s.kv_external_bytes or 0)


def kinds_shares(series: Sequence[tuple]) -> dict:
    """Each kind's share of the memory x time held (a kinds_series; each sample holding until the next); the
    shares add up to 1. None for every kind when nothing was held."""
    totals = [0.0] * (1 + len(KINDS))
    for row, nxt in itertools.pairwise(series):
        totals = [total + value * (nxt[0] - row[0]) for total, value in zip(totals, row[1:], strict=True)]
    held, parts = totals[0], totals[1:]
    return {kind: (part / held if held else None) for kind, part in zip(KINDS, parts, strict=True)}
