"""Paired ratios for the benches whose sides take turns round by round (bench.dashboard_overhead,
bench.lab_vs_offline_vllm): each round's ratio of two sides, summed up as a geometric mean with a 95% t-interval,
and the orders the sides take their turns in.

Turns in a balanced order keep a drifting machine from favouring a side; a round's ratio is steadier than
either side only where the sides of a round move together. On a lent H100 host they mostly did not (offline
and engine mode correlated at r = 0.23 within a round, docs/benchmarks.md): there the spread is per call, and
more rounds, not the pairing, narrow the interval.
"""

from __future__ import annotations

import math
import statistics

MIN_ROUNDS = 4  # fewer paired rounds give no interval


def geometric_interval(ratios: list[float]) -> tuple[float, float | None, float | None]:
    """The geometric mean of ratios and a 95% t-interval of it, from their logarithms (no interval under
    MIN_ROUNDS: too few to say). Rounds of one run share one process, so the interval is, if anything, narrow."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < MIN_ROUNDS:
        return math.exp(mean), None, None
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def t_975(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` degrees of freedom: the Cornish-Fisher expansion about the normal
    quantile (2.769 for 4, exact 2.776; 2.110 for 17, exact 2.110)."""
    z = statistics.NormalDist().inv_cdf(0.975)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def interval_text(ratios: list[float]) -> str:
    """'mean [low-high]', or 'mean [-]' under MIN_ROUNDS."""
    mean, low, high = geometric_interval(ratios)
    return f"{mean:.3f} [-]" if low is None else f"{mean:.3f} [{low:.3f}-{high:.3f}]"


def rotated(sides: list, round_: int) -> list:
    """The sides in round ``round_``'s order: turned by one each round, so each goes first as often."""
    shift = round_ % len(sides)
    return sides[shift:] + sides[:shift]


def turn_order(sides: list, round_: int) -> list:
    """The sides in round ``round_``'s order: turned by one every two rounds and backwards on odd rounds, so over
    2 x len(sides) rounds each goes first as often as the others and before each other side half the time."""
    order = rotated(sides, round_ // 2)
    return order[::-1] if round_ % 2 else order
