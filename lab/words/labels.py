"""Measured or computed: the one rule that says which a figure is, for every label the notebooks print.

A figure is **measured** when an engine reported it: its clock (tok/s, time to first token, a step's time), its
counters (preemptions, prefix-cache hits), its KV pool's used blocks, the block ids it handed out, or a ratio of
such figures. It is **computed** when the lab worked it out itself: from a formula and the model's config (bytes
per token, the blocks N tokens need), from a batch's shape (HF's KV slots: rows x padded length at every step,
which the lab counts and HF never reports), or by arithmetic on numbers chosen in advance (a memory plan). A call
site names the figure's origin, one of ``ORIGINS``; ``kind`` turns it into the word. ``COMPUTED`` lists the fields
of stored results that are computed, so that a check can tell an engine's figure from the lab's own arithmetic
(``reported``: every engine-reported number a result holds).
"""

from __future__ import annotations

from collections.abc import Iterator

from lab.engines.registry import spec

ORIGINS = {
    "engine": "measured",  # an engine reported it (or a ratio of figures engines reported)
    "formula": "computed",  # a formula over the model's config or chosen sizes (bytes per token, blocks for N)
    "shape": "computed",  # counted from a batch's shape (HF's KV slots: padded rows x steps)
    "arithmetic": "computed",  # arithmetic on numbers chosen in advance (a plan, a what-if)
}
KV_ORIGINS = {"batch": "shape", "allocator": "engine", "metrics": "engine"}  # an engine's kv_source -> origin
STATIC = "-static"  # a row of HF with a static cache (the waste experiment): its engine's figures, shown apart
HF_KV = ("peak_reserved_bytes", "peak_real_bytes", "waste_at_peak")  # HF's KV, counted from its batch's shape
COMPUTED = {  # experiment (or "sweep", "run") -> its fields that are computed ("*": all of them)
    "cache": {"bytes_per_token", "formula", "query_heads", "kv_heads", "pool_bytes", "pool_tokens_computed"},
    "waste": {"bytes_per_token", "bytes_per_token_formula", "hf", "hf-static"},  # HF's KV from its batch's shape
    "blocks": set(),
    "memory": {"*"},  # the memory planner: arithmetic before anything loads
    "sharing": {"unshared_blocks_estimate"},
    "prefix": {"computed"},
    "why": {"budget"},
    "sweep": {f"kv_{key}" for key in HF_KV},
    "run": set(HF_KV),
}


def kind(origin: str) -> str:
    """'measured' or 'computed' for a figure of ``origin`` (one of ORIGINS)."""
    if origin not in ORIGINS:
        raise ValueError(f"origin {origin!r}: say where the figure comes from, one of {', '.join(ORIGINS)}")
    return ORIGINS[origin]


def label(origin: str) -> str:
    """'Measured' or 'Computed', as a label opens."""
    return kind(origin).capitalize()


def kv_origin(engine: str) -> str:
    """Where an engine's KV figures come from, read from its registry entry's ``kv_source``: vLLM reports its used
    blocks; HF's (with or without a static cache) are counted from its batch's shape."""
    return KV_ORIGINS[spec(engine.removesuffix(STATIC)).kv_source]


def computed_field(where: str, key: str) -> bool:
    """Whether field ``key`` of a result of ``where`` (an experiment's name, "sweep" or "run") is computed; a
    sweep point's ``name@users`` counts as ``name``."""
    fields = COMPUTED.get(where, set())
    return "*" in fields or key.split("@")[0] in fields


def reported(value, where: str) -> Iterator[float]:
    """Every number engines reported that a result's fields hold (dicts and lists walked, computed fields and
    entries whose ``origin`` is computed left out)."""
    if isinstance(value, dict):
        if value.get("origin") in ORIGINS and kind(value["origin"]) == "computed":
            return
        for key, item in value.items():
            if not computed_field(where, str(key)):
                yield from reported(item, where)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from reported(item, where)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value
