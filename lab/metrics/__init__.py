"""Metrics: pure functions over request records and engine samples.

Each metric is defined once, here, and written down in docs/metrics.md; the UI, the CLI and the notebooks
all call these functions.

- TTFT  = first_token_s - send_s, per request.
- E2E   = end_s - send_s, per request (end = arrival of its last token).
- TPOT  = (E2E - TTFT) / (output_tokens - 1), per request with at least 2 tokens (vLLM's definition:
          the mean gap of one request, so every request weighs the same).
- ITL   = every gap between two consecutive tokens of a request, pooled over all requests.
- output tok/s = output tokens of completed requests / level duration, where the duration runs from the
          first send to the last end of the level.
- total tok/s = (prompt + output tokens of completed requests) / level duration.
- req/s = completed requests / level duration.
- ratio = vLLM output tok/s / HF output tok/s at the same user level (and vLLM / HF-CB where transformers'
          continuous batching ran too; without vLLM, e.g. two servers, the second engine over the first).
          With repeats, each engine's tok/s is its mean over the repeats, and the ratio's spread is the
          min-max of the per-repeat ratios (repeat k of vLLM over repeat k of HF).
- queue = send_s - scheduled_s (open loop only): how long a due request waited in the client (the
          concurrency cap); TTFT and E2E "from schedule" add it, as the user who arrived then waited it.
- goodput = completed requests meeting every SLO target / level duration (req/s); the TTFT and E2E it
          checks run from the scheduled time in open loop, from the send otherwise.
- spread = n, mean, min and max of one figure over the repeats of a level.
Percentiles use linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from lab.engines.registry import BASELINE, RATIO_TOP, ratio_bases
from lab.load.driver import RequestRecord
from lab.status import RequestStatus


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of one latency, in seconds (None when there is no data)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def distribution(values: Iterable[float]) -> Distribution:
    """Mean, p50, p90 and p99 of the values."""
    data = list(values)
    if not data:
        return Distribution(None, None, None, None)
    return Distribution(sum(data) / len(data), percentile(data, 50), percentile(data, 90),
                        percentile(data, 99))


def ttft_s(record: RequestRecord) -> float | None:
    """Time to first token."""
    return None if record.first_token_s is None else record.first_token_s - record.send_s


def e2e_s(record: RequestRecord) -> float | None:
    """End-to-end latency: send to last token."""
    return None if record.end_s is None else record.end_s - record.send_s


def tpot_s(record: RequestRecord) -> float | None:
    """Time per output token after the first: (E2E - TTFT) / (tokens - 1)."""
    if record.output_tokens < 2:
        return None
    return (record.token_times_s[-1] - record.token_times_s[0]) / (record.output_tokens - 1)


def queue_s(record: RequestRecord) -> float | None:
    """Open loop: how long a due request waited in the client before it was sent."""
    return None if record.scheduled_s is None else record.send_s - record.scheduled_s


def ttft_from_schedule_s(record: RequestRecord) -> float | None:
    """TTFT counted from when the request was due (open loop), else from its send."""
    wait = queue_s(record) or 0.0
    return None if (ttft := ttft_s(record)) is None else ttft + wait


def e2e_from_schedule_s(record: RequestRecord) -> float | None:
    """E2E counted from when the request was due (open loop), else from its send."""
    wait = queue_s(record) or 0.0
    return None if (e2e := e2e_s(record)) is None else e2e + wait


SLO_CHECKS = {"ttft": ttft_from_schedule_s, "tpot": tpot_s, "e2e": e2e_from_schedule_s}


def meets_slo(record: RequestRecord, slo: Sequence[tuple[str, float]]) -> bool:
    """Whether a completed request meets every target (a TPOT it cannot have, with 1 token, passes; a missing
    TTFT or E2E fails)."""
    if record.status != RequestStatus.OK:
        return False

    def meets(name: str, limit: float) -> bool:
        value = SLO_CHECKS[name](record)
        return value <= limit if value is not None else name == "tpot"

    return all(meets(name, limit) for name, limit in slo)


def itls_s(record: RequestRecord) -> list[float]:
    """Inter-token latencies: the gaps between consecutive tokens."""
    times = record.token_times_s
    return [b - a for a, b in itertools.pairwise(times)]


def level_window_s(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """(first send, last end) of a level's records."""
    if not records:
        return None
    start = min(r.send_s for r in records)
    end = max((r.end_s for r in records if r.end_s is not None), default=start)
    return start, end


@dataclass(frozen=True)
class LevelSummary:
    """The figures of one engine at one user level."""

    engine: str
    users: int
    requests: int
    completed: int
    errors: int
    cancelled: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    req_s: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    repeat: int = 0
    queue_s: Distribution | None = None  # open loop only
    ttft_scheduled_s: Distribution | None = None  # open loop only: TTFT from the scheduled send
    goodput_req_s: float | None = None  # with an SLO only
    slo_met: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], engine: str, users: int, repeat: int = 0,
              slo: Sequence[tuple[str, float]] = ()) -> LevelSummary:
    """Summarize one level's records with the definitions of this module.

    Args:
        records: Every record of the level (completed, errored and cancelled).
        engine: Engine name.
        users: User level (the concurrency cap in open loop).
        repeat: Which repeat of the level (0 for the first).
        slo: Latency targets for goodput, e.g. (("ttft", 0.5),).

    Returns:
        The level's summary; throughput counts completed requests only.
    """
    done = [r for r in records if r.status == RequestStatus.OK]
    window = level_window_s(records)
    duration = (window[1] - window[0]) if window else 0.0
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)

    def per_s(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    return LevelSummary(
        engine=engine, users=users, requests=len(records), completed=len(done),
        errors=sum(1 for r in records if r.status not in (RequestStatus.OK, RequestStatus.CANCELLED)),
        cancelled=sum(1 for r in records if r.status == RequestStatus.CANCELLED),
        duration_s=duration, input_tokens=in_tokens, output_tokens=out_tokens,
        output_tok_s=per_s(out_tokens), total_tok_s=per_s(in_tokens + out_tokens),
        req_s=per_s(len(done)),
        ttft_s=distribution(v for r in done if (v := ttft_s(r)) is not None),
        tpot_s=distribution(v for r in done if (v := tpot_s(r)) is not None),
        itl_s=distribution(g for r in done for g in itls_s(r)),
        e2e_s=distribution(v for r in done if (v := e2e_s(r)) is not None), repeat=repeat,
        **open_loop_fields(records, done, slo, per_s),
    )


def open_loop_fields(records: Sequence[RequestRecord], done: Sequence[RequestRecord],
                     slo: Sequence[tuple[str, float]], per_s: Callable[[float], float]) -> dict:
    """The summary's queue and from-schedule TTFT (open loop) and goodput (with an SLO)."""
    fields = {}
    if any(r.scheduled_s is not None for r in records):
        fields["queue_s"] = distribution(v for r in records
                                         if r.status == RequestStatus.OK and (v := queue_s(r)) is not None)
        fields["ttft_scheduled_s"] = distribution(v for r in done if (v := ttft_from_schedule_s(r)) is not None)
    if slo:
        met = sum(1 for r in done if meets_slo(r, slo))
        fields["slo_met"], fields["goodput_req_s"] = met, per_s(met)
    return fields


def improvement_ratio(vllm_tok_s: float | None, hf_tok_s: float | None) -> float | None:
    """vLLM output tok/s over HF output tok/s (None when either is missing or HF made nothing)."""
    if not vllm_tok_s or not hf_tok_s:
        return None
    return vllm_tok_s / hf_tok_s


@dataclass(frozen=True)
class Spread:
    """One figure over the repeats of a level: how many, mean, lowest and highest."""

    n: int
    mean: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return asdict(self)


def spread(values: Iterable[float]) -> Spread | None:
    """n, mean, min and max of the values (None when there are none)."""
    data = list(values)
    return Spread(len(data), sum(data) / len(data), min(data), max(data)) if data else None


def level_rates(rows: Iterable[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """Output tok/s by (engine, users), then by repeat, from summary.json ``runs`` rows (or
    ``LevelSummary.to_dict()``); a row without ``repeat`` is repeat 0."""
    rates: dict[tuple[str, int], dict[int, float]] = {}
    for row in rows:
        rates.setdefault((row["engine"], row["users"]), {})[row.get("repeat", 0)] = row["output_tok_s"]
    return rates


def tok_s_spreads(rows: Iterable[dict]) -> dict[tuple[str, int], Spread]:
    """The spread of output tok/s over the repeats of every (engine, users) level."""
    return {key: spread(by_repeat.values()) for key, by_repeat in level_rates(rows).items()}


def ratio_pairs(engines: Sequence[str]) -> list[tuple[str, str]]:
    """Which ratios a run shows, as (top, base): vLLM over each ratio base that ran (HF, HF-CB: the registry's
    ratio_base); otherwise (two servers, or vLLM beside a server) the second engine over the first."""
    bases = ratio_bases() if RATIO_TOP in engines else ()
    pairs = [(RATIO_TOP, base) for base in bases if base in engines]
    return pairs or ([(engines[1], engines[0])] if len(engines) > 1 else [])


def ratio_key(top: str, base: str) -> str:
    """A ratio's key in summary.json's ``ratios``: the base alone under vLLM (``hf``), else ``top/base``."""
    return base if top == RATIO_TOP else f"{top}/{base}"


def ratio_from_key(key: str) -> tuple[str, str]:
    """(top, base) of a ``ratios`` key."""
    top, _, base = key.rpartition("/")
    return (top or RATIO_TOP), base


def ratio_spreads(rows: Iterable[dict], base: str = BASELINE, top: str = RATIO_TOP) -> dict[int, Spread]:
    """The spread of the per-repeat ratio ``top`` / ``base`` at every user level where both ran a same repeat."""
    rates = level_rates(rows)
    result = {}
    for users in sorted({users for _, users in rates}):
        vllm, hf = rates.get((top, users), {}), rates.get((base, users), {})
        pairs = [improvement_ratio(vllm[k], hf[k]) for k in sorted(vllm.keys() & hf.keys())]
        if found := spread(r for r in pairs if r is not None):
            result[users] = found
    return result


TRUSTED_REQUESTS = 10  # finished requests per engine and level below which a level's tok/s is called noisy


def thin_levels(rows: Iterable[dict], least: int = TRUSTED_REQUESTS) -> list[int]:
    """User levels where some engine finished fewer than ``least`` requests (over all repeats): one slow
    request moves their tok/s a lot (seen: a 1-user ratio of 1.55x in one run, 1.20x in the next)."""
    done: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["engine"], row["users"])
        done[key] = done.get(key, 0) + row["completed"]
    return sorted({users for (_, users), count in done.items() if count < least})


def ratios_by_users(rows: Iterable[dict], base: str = BASELINE, top: str = RATIO_TOP) -> dict[int, float]:
    """The improvement ratio (mean ``top`` tok/s / mean ``base`` tok/s) at every level where both engines ran."""
    means = {key: s.mean for key, s in tok_s_spreads(rows).items()}
    result = {}
    for users in sorted({users for _, users in means}):
        ratio = improvement_ratio(means.get((top, users)), means.get((base, users)))
        if ratio is not None:
            result[users] = ratio
    return result


def throughput_series(records: Sequence[RequestRecord], bucket_s: float = 1.0,
                      origin_s: float | None = None) -> list[tuple[float, float]]:
    """Output tok/s over time: tokens arrived in each bucket / bucket length.

    Args:
        records: Records whose token arrival times are counted (any status).
        bucket_s: Bucket length in seconds.
        origin_s: Time zero; defaults to the first send.

    Returns:
        (bucket start relative to origin, tok/s) pairs, empty buckets included.
    """
    times = [t for r in records for t in r.token_times_s]
    if not times:
        return []
    origin = origin_s if origin_s is not None else min(r.send_s for r in records)
    last = max(times)
    count = int((last - origin) // bucket_s) + 1
    buckets = [0] * count
    for t in times:
        index = int((t - origin) // bucket_s)
        if 0 <= index < count:
            buckets[index] += 1
    return [(i * bucket_s, n / bucket_s) for i, n in enumerate(buckets)]
