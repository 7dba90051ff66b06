"""A level's tok/s taken apart into the engine's steps, and each step set against the hardware's floor.

An engine makes tokens in steps (one forward pass: an iteration of HF's generate loop, one vLLM engine-core
step). Over a level of ``wall`` seconds with ``steps`` steps that together took ``busy`` seconds:

    output tok/s = (output tokens / steps) x (steps / busy) x (busy / wall)

so for two engines at one level, exactly,

    top / base = (tokens per step, top / base) x (seconds per step, base / top) x (busy fraction, top / base).

Tokens per step is what batching and KV memory buy (rows a step runs that make a useful token); seconds per
step is what a step costs (kernels, framework overhead, the batch's size); the busy fraction is time the engine
spent waiting for work (HF's gather, a client's pace). Steps and their times are measured by the lab's clock
around each engine (lab.engines.base.StepClock); output tokens and wall time are the level's summary's.

The floor of a decode step (computed): it must read the weights once (lab.model.shape_bytes) and the running
contexts' KV, so it takes at least (weight bytes + KV bytes) / memory bandwidth. A step near its floor is
bandwidth-bound; one many times above it is bound by something else (compute, kernel launches, framework overhead).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

FACTORS = ("tokens_per_step", "s_per_step", "busy_fraction")
NEAR_FLOOR = 2.0  # a step within this multiple of its floor is called bandwidth-bound (a copy reaches ~90% of peak)


def level_steps(samples: Iterable, kv_bytes_per_token: int | None) -> dict | None:
    """What a level's step samples say: how many steps, their total time, the tokens and rows they ran, the KV
    of the running contexts they read (mean bytes a step); None when the engine timed no step."""
    steps = [s for s in samples if s.step_s is not None]
    if not steps:
        return None
    tokens = [s.step_tokens for s in steps]
    rows = [s.running for s in steps if s.running]
    kv = [b for b in (kv_read_bytes(s, kv_bytes_per_token) for s in steps) if b is not None]
    return {"count": len(steps), "busy_s": sum(s.step_s for s in steps),
            "tokens": None if None in tokens else sum(tokens),
            "rows": sum(rows) / len(rows) if rows else None, "kv_bytes": sum(kv) / len(kv) if kv else None}


def kv_read_bytes(sample, per_token: int | None) -> float | None:
    """The KV the running contexts hold at a step: HF's real bytes (padding and finished rows not counted), or
    vLLM's used blocks in bytes; None where the sample says neither."""
    if sample.kv_real_bytes is not None:
        return sample.kv_real_bytes
    if None in (sample.kv_usage, per_token, sample.kv_total_blocks, sample.kv_block_size):
        return None
    return sample.kv_usage * sample.kv_total_blocks * sample.kv_block_size * per_token


def pooled(rows: Sequence[dict]) -> dict | None:
    """One engine's factors at one level over its repeats (sums over sums, so that they multiply to its pooled
    tok/s); None when a repeat has no step count or no output."""
    if not rows or any(not r.get("steps") or not r["output_tokens"] or not r["duration_s"] for r in rows):
        return None
    steps = sum(r["steps"]["count"] for r in rows)
    busy = sum(r["steps"]["busy_s"] for r in rows)
    tokens = sum(r["output_tokens"] for r in rows)
    found = {"steps": steps, "tokens_per_step": tokens / steps, "s_per_step": busy / steps,
             "busy_fraction": busy / sum(r["duration_s"] for r in rows)}
    found["useful_rows"] = _mean_per_step(rows, "tokens")
    found["rows"] = _mean(rows, "rows")
    found["kv_bytes"] = _mean(rows, "kv_bytes")
    return found


def _mean_per_step(rows: Sequence[dict], key: str) -> float | None:
    values = [r["steps"][key] for r in rows]
    return None if None in values else sum(values) / sum(r["steps"]["count"] for r in rows)


def _mean(rows: Sequence[dict], key: str) -> float | None:
    values = [r["steps"][key] for r in rows if r["steps"][key] is not None]
    return sum(values) / len(values) if values else None


def ratios(top: dict, base: dict) -> dict:
    """The three factors of top / base (each > 1 where top gains), and their product."""
    found = {"tokens_per_step": top["tokens_per_step"] / base["tokens_per_step"],
             "s_per_step": base["s_per_step"] / top["s_per_step"],
             "busy_fraction": top["busy_fraction"] / base["busy_fraction"]}
    found["product"] = math.prod(found[f] for f in FACTORS)
    return found


def level_factors(runs: Sequence[dict], users: int, base: str, top: str) -> dict | None:
    """One level's identity for top / base: each engine's pooled factors, the pooled ratios and, per factor, the
    spread of the repeats' own ratios (repeat k of top against repeat k of base); None when either engine's steps
    are unknown."""
    found = {name: pooled(_rows(runs, name, users)) for name in (base, top)}
    if None in found.values():
        return None
    pairs = [ratios(t, b) for t, b in zip(_per_repeat(runs, top, users), _per_repeat(runs, base, users), strict=False)
             if t and b]
    whole = ratios(found[top], found[base])
    factors = {f: _factor(f, whole[f], [p[f] for p in pairs]) for f in FACTORS}
    return {"base": base, "top": top, "engines": found, "factors": factors,
            "product": math.prod(f["value"] for f in factors.values())}


def _factor(name: str, value: float, repeats: list[float]) -> dict:
    low, high = (min(repeats), max(repeats)) if repeats else (value, value)
    return {"name": name, "value": value, "low": low, "high": high, "n": max(1, len(repeats))}


def _rows(runs: Sequence[dict], engine: str, users: int) -> list[dict]:
    return [r for r in runs if r["engine"] == engine and r["users"] == users]


def _per_repeat(runs: Sequence[dict], engine: str, users: int) -> list[dict | None]:
    return [pooled([r]) for r in sorted(_rows(runs, engine, users), key=lambda r: r["repeat"])]


def all_factors(runs: Sequence[dict], base: str = "hf", top: str = "vllm") -> dict[str, dict]:
    """summary.json's ``factors``: level_factors at every level where both engines timed their steps."""
    levels = sorted({r["users"] for r in runs})
    found = {str(u): level_factors(runs, u, base, top) for u in levels}
    return {users: f for users, f in found.items() if f is not None}


def floor(engine: dict, weights: int, bandwidth: float) -> dict:
    """A decode step's floor for one engine at one level (computed): its weights and mean KV read once."""
    kv = engine.get("kv_bytes") or 0.0
    floor_s = (weights + kv) / bandwidth
    return {"bytes": weights + kv, "bandwidth": bandwidth, "floor_s": floor_s,
            "multiple": engine["s_per_step"] / floor_s}


def add_floors(factors: dict[str, dict], weights: int | None, bandwidth: float | None) -> None:
    """Each engine's floor beside its factors, where the weights and the bandwidth are known."""
    if not weights or not bandwidth:
        return
    for level in factors.values():
        for engine in level["engines"].values():
            engine["floor"] = floor(engine, weights, bandwidth)
