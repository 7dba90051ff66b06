"""The chat workload in words: what re-sending the history cost, per turn (lab.metrics.turns' rows in
summary.json: prompt tokens, prefix-cache hits and TTFT of each turn; the Load test, reports, ``lab`` and notebooks).
"""

from __future__ import annotations


def chat_answer(summary: dict) -> list[str]:
    """Per engine and user level, its first turn against its last: prompt, prefix-cache hits and TTFT (measured)."""
    lines = []
    blocks = {run["engine"]: (run.get("kv") or {}).get("block_size") for run in summary.get("runs", [])}
    args = summary.get("engine_args") or {}
    for (engine, users), rows in _first_repeat_turns(summary).items():
        if len(rows) > 1:
            off = (args.get(engine) or {}).get("enable_prefix_caching") is False
            lines.append(_turn_line(engine, users, rows, blocks.get(engine), off))
    return lines


def _first_repeat_turns(summary: dict) -> dict[tuple[str, int], list[dict]]:
    """The per-turn rows of each engine and level's first repeat, turns ascending."""
    found: dict[tuple[str, int], list[dict]] = {}
    for row in summary.get("turns") or []:
        if row["repeat"] == 0:
            found.setdefault((row["engine"], row["users"]), []).append(row)
    return found


def _turn_line(engine: str, users: int, rows: list[dict], block: int | None, off: bool = False) -> str:
    """One engine's turn 1 against its last turn, the cache's share said only where the engine reports it
    (``off``: its prefix cache was turned off)."""
    first, before, last = rows[0], rows[-2], rows[-1]
    said = (f"{engine} at {users} users: turn {first['turn']} prompts averaged {first['prompt_tokens_mean']:.0f} "
            f"tokens, turn {last['turn']} {last['prompt_tokens_mean']:.0f} (the history re-sent); ")
    if first["ttft_p50_s"] and last["ttft_p50_s"]:
        grew = last["ttft_p50_s"] / first["ttft_p50_s"]
        said += (f"TTFT p50 went from {first['ttft_p50_s'] * 1000:.0f} to {last['ttft_p50_s'] * 1000:.0f} ms "
                 f"({grew:.2f}x, measured). ")
    hit = last["prefix_hit_rate"]
    if off:
        return said + (f"Its prefix cache was off (enable_prefix_caching=False): it computed every one of the "
                       f"{last['prompt_tokens_mean']:.0f} prompt tokens again at turn {last['turn']}.")
    if hit is None:
        return said + (f"It reports no prefix cache: it computed every one of the {last['prompt_tokens_mean']:.0f} "
                       f"prompt tokens again at turn {last['turn']}.")
    if hit > (first["prefix_hit_rate"] or 0):
        return said + (f"Its prefix cache served {hit:.0%} of turn {last['turn']}'s prompt tokens (against "
                       f"{first['prefix_hit_rate']:.0%} at turn {first['turn']}): the history's whole blocks were not "
                       f"computed again.")
    said += f"Its prefix cache served {hit:.0%} of turn {last['turn']}'s prompt tokens, no more than at turn "
    said += f"{first['turn']}: "
    if block and before["prompt_tokens_mean"] < block:
        return said + (f"it keeps whole blocks of {block} tokens only, and turn {before['turn']}'s prompts averaged "
                       f"{before['prompt_tokens_mean']:.0f} tokens, less than a block: the history was computed again.")
    return said + "the history was computed again: its blocks were no longer cached when the turn came (evicted)."
