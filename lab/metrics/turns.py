"""Per-turn figures of a multi-turn (chat) run: what re-sending the history costs at each turn number.

For each engine, user level, repeat and turn: the completed requests, their mean prompt (the history so far plus
the new message), the prefix-cache hit rate (prompt tokens the engine served from its cache over all prompt
tokens, from each request's own count: vLLM's num_cached_tokens; None for an engine that does not report one,
such as HF, which keeps no cache between requests and recomputes every prompt token), and TTFT p50 and mean.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.load.driver import RequestRecord
from lab.metrics import percentile, ttft_s
from lab.status import RequestStatus


def turn_rows(levels: Sequence[tuple[str, int, int, Sequence[RequestRecord]]]) -> list[dict]:
    """One row per (engine, users, repeat, turn) of completed requests that carry a turn number.

    Args:
        levels: (engine, users, repeat, records) of each level.

    Returns:
        Rows in level order, turns ascending; [] for a run without turns.
    """
    rows = []
    for engine, users, repeat, records in levels:
        done = [r for r in records if r.turn is not None and r.status == RequestStatus.OK]
        for turn in sorted({r.turn for r in done}):
            rows.append({"engine": engine, "users": users, "repeat": repeat, "turn": turn,
                         **turn_stats([r for r in done if r.turn == turn])})
    return rows


def turn_stats(records: Sequence[RequestRecord]) -> dict:
    """Requests, mean prompt tokens, prefix-cache hit rate and TTFT (p50, mean) of one turn's requests."""
    prompt = sum(r.prompt_tokens for r in records)
    known = [r.cached_tokens for r in records if r.cached_tokens is not None]
    ttfts = [t for t in (ttft_s(r) for r in records) if t is not None]
    return {"requests": len(records), "prompt_tokens_mean": prompt / len(records),
            "cached_tokens": sum(known) if len(known) == len(records) else None,
            "prefix_hit_rate": sum(known) / prompt if len(known) == len(records) and prompt else None,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None}
