"""Sentences from numbers: the rules every sentence the lab shows follows, kept in one place.

Each sentence is built from one result alone and branches on its figures (which factor is largest, whether a spread
crosses 1, whether vLLM held more requests than HF's cap); it states no outcome the numbers do not show, and a
sentence whose premise the result lacks is not printed (``held``). Figures from formulas are called computed,
figures from engines measured (lab.words.labels). This module keeps what the sentences share: factors, gains and spreads
in words, user counts, how KV figures were had. Each experiment's own sentences live beside it, in
``lab/experiments/<name>_words.py``; the load test's in ``lab/metrics/levels_words.py`` (levels and the machine),
``steps_words.py`` (a level's factors) and ``turns_words.py`` (the chat workload's turns); the sweeps' in
``lab/sweeps/words.py``; ``lab.experiments.answers`` finds a stored experiment's.
"""

from __future__ import annotations

from lab.experiments.ladder import clear
from lab.words.labels import kind, kv_origin

POOLED = "the repeats pooled: all their tokens over all their time"  # a level's factors and their product
MEAN_OF_REPEATS = "each engine's mean tok/s over its repeats"  # a load test's headline ratio (summary.json's ratio)
PAIRED = "the geometric mean of the repeats' own ratios"  # a ladder's factors and total (lab.experiments.ladder)


def times(value: float) -> str:
    """A factor in words: '3.10x', or '0.80x (a loss)'."""
    return f"{value:.2f}x" + (" (a loss)" if value < 0.995 else "")


def factor_words(f: dict) -> str:
    """A measured factor in words: a loss only when every repeat lost, 'within noise' when the repeats straddle 1."""
    if not clear(f):
        return f"{f['value']:.2f}x (its repeats straddle 1: no measured gain or loss)"
    return times(f["value"]) if f["n"] == 1 or f["high"] < 1 or f["value"] >= 0.995 else f"{f['value']:.2f}x"


def spread_words(f: dict) -> str:
    """'repeats 2.9-3.3x, n=3', or 'one repeat' (no spread to show)."""
    return f"repeats {f['low']:.2f}-{f['high']:.2f}x, n={f['n']}" if f["n"] > 1 else "one repeat: no spread"


def gain_words(gain: float, spread: dict | None = None) -> str:
    """A tok/s gain from the fewest users to the most: 'gained 2.31x (repeats 2.10-2.52x)', 'lost: its tok/s fell
    to 0.47x', or, when the repeats straddle 1, no measured gain or loss."""
    many = spread is not None and spread["n"] > 1
    if many and not clear(spread):
        return (f"moved {gain:.2f}x, within its repeats' spread ({spread['low']:.2f}-{spread['high']:.2f}x): no "
                f"measured gain or loss")
    said = f"gained {gain:.2f}x" if gain >= 1 else f"lost: its tok/s fell to {gain:.2f}x"
    return said + (f" (repeats {spread['low']:.2f}-{spread['high']:.2f}x)" if many else "")


def users_words(users: int) -> str:
    """'1 user', '4 users'."""
    return f"{users} user{'s' if users > 1 else ''}"


def by_users(levels: dict) -> list[tuple[str, dict]]:
    """A {users: level} dict's items, fewest users first."""
    return sorted(levels.items(), key=lambda kv: int(kv[0]))


def kv_words(engine: str) -> str:
    """How an engine's KV figures were had: 'measured' (vLLM's used blocks) or 'computed from its batch's shape'."""
    return kind(kv_origin(engine)) + ("" if kv_origin(engine) == "engine" else " from its batch's shape")


def held(answer, *args) -> list[str]:
    """The helper's lines, or none where the result lacks a figure they rest on (a partial or an older result):
    a sentence whose premise the result does not hold is not printed."""
    try:
        return answer(*args)
    except (KeyError, TypeError, IndexError, ZeroDivisionError):
        return []
