"""Open-loop arrivals: when each request is due, drawn from a seeded process (as `vllm bench serve` does).

- poisson: exponential gaps with mean 1/rate (a Poisson process).
- constant: a request every 1/rate seconds.
- gamma: gamma gaps with shape = burstiness and mean 1/rate; burstiness < 1 is burstier than Poisson,
  > 1 more even (1 is Poisson).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

ARRIVALS = ("poisson", "constant", "gamma")


def gaps_s(rate: float, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless gaps between consecutive sends, in seconds.

    Args:
        rate: Requests per second (mean).
        arrival: One of ARRIVALS.
        burstiness: The gamma shape (gamma only).
        seed: Same seed, same gaps (a stream of its own: the workload's lengths use Random(seed) too, and
            gaps drawn from that same stream would follow the prompt lengths).
    """
    rng = random.Random(f"arrivals:{seed}")
    while True:
        if arrival == "constant":
            yield 1.0 / rate
        elif arrival == "gamma":
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        else:
            yield rng.expovariate(rate)


def schedule_s(rate: float, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless send times from the level's start (the first request goes at 0)."""
    return itertools.accumulate(gaps_s(rate, arrival, burstiness, seed), initial=0.0)
