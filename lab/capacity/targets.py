"""A capacity search's latency targets and bounds: what --slo may say, parsed and refused as the CLI, the page
and the experiment name it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lab.config import DECIMAL, parse_slo

METRICS = ("ttft", "tpot", "itl", "e2e")  # what a capacity target may bound (lab.metrics defines each)
PERCENTILES = (50.0, 99.9)  # a target's percentile: from the median to p99.9 (p100 is one request, an outlier)
DEFAULT_PERCENTILE = 95.0  # a target written without _pNN
NEAR = 0.10  # a percentile within 10% of its limit: one more run of that level decides it
AGREE = 0.10  # Little's law agrees when computed and measured L are within 10%
STEADY_EDGE = 0.10  # steady: the window's edges can move Little's law's agreement by at most 10% (littles_law)
REQUESTS_PER_USER = 3  # every user sends at least this many per probe
MIN_REQUESTS = 20  # a probe sends at least this many (p95 of 20: the 19th-20th of them)
RATE_PROBE_S = 10.0  # an open-loop probe schedules at least this many seconds of arrivals
RATE_FLOOR = 64  # a rate search that misses at its start halves down to start / 64 at most
RATE_RESOLUTION = 0.10  # a rate search stops when the bracket is within 10% of its top
DEFAULT_TIME_LIMIT_S = 1800.0  # half an hour: a CPU search of two engines to 16 users fits
MAX_TIME_LIMIT_S = 86400.0  # a day: past it a typo (100000 for 100) would hold the lab for days
TIME_LIMIT = "time limit"  # why a search stopped early (capacity.json's ``ended``)
RUNNING, WAITING = "running", "waiting"  # ``ended`` while the search goes: this engine's goes on, or is still to come
FLAGS = {"slo": "--slo", "max_users": "--max-users", "requests_per_user": "--requests-per-user",
         "min_requests": "--min-requests", "time_limit": "--time-limit", "start_rate": "--start-rate",
         "max_rate": "--max-rate"}  # how a refusal names each bound: the CLI's flags (the Params: its fields)
KEYWORDS = {**{key: key for key in FLAGS}, "time_limit": "time_limit_s"}  # capacity_search's: its keywords


@dataclass(frozen=True)
class Target:
    """One latency target: this percentile of this metric at most ``limit_s`` seconds."""

    metric: str
    percentile: float
    limit_s: float

    @property
    def name(self) -> str:
        """'ttft_p95', as --slo writes it."""
        return f"{self.metric}_p{self.percentile:g}"

    def words(self) -> str:
        """'ttft_p95 <= 2 s'."""
        return f"{self.name} <= {seconds_words(self.limit_s)}"

    def to_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}


def parse_targets(text: str, flag: str = FLAGS["slo"]) -> tuple[Target, ...]:
    """'ttft_p95=2s,tpot_p95=150ms' as Targets (lab.config.parse_slo splits it; a bare metric is its p95).
    ``flag``: how a refusal names the field (--slo on the CLI, slo in the page's and the experiment's Params).

    Raises:
        ValueError: no target, an unknown metric, a percentile outside PERCENTILES, a limit of 0 or below, or a
            target given twice; each message names the value, the limit and what to write instead.
    """
    pairs = parse_slo(text)
    if not pairs:
        raise ValueError(f"{flag}: give at least one latency target, e.g. ttft_p95=2s,tpot_p95=150ms")
    targets = tuple(target(name, limit, flag) for name, limit in pairs)
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"{flag}: each target once, got {', '.join(names)}")
    return targets


def target(name: str, limit: float, flag: str = FLAGS["slo"]) -> Target:
    """One NAME=LIMIT pair as a Target (ValueError naming what is wrong)."""
    metric, _, suffix = name.partition("_p")
    if metric not in METRICS:
        raise ValueError(f"{flag}: unknown metric {metric!r} in {name!r}; use one of {', '.join(METRICS)}, with a "
                         f"percentile suffix _pNN (e.g. ttft_p95=2s)")
    low, high = PERCENTILES
    if suffix and not DECIMAL.fullmatch(suffix):
        raise ValueError(f"{flag}: {name!r}: after _p give a percentile from {low:g} to {high:g} (e.g. {metric}_p95)")
    pct = float(suffix) if suffix else DEFAULT_PERCENTILE
    if not low <= pct <= high:
        raise ValueError(f"{flag}: {name}: percentile {pct:g} is outside {low:g}-{high:g}; use e.g. {metric}_p99")
    if limit <= 0:
        raise ValueError(f"{flag}: {name} must be a positive time (e.g. {name}=2s or {name}=150ms), not {limit:g}")
    return Target(metric, pct, limit)


def seconds_words(value: float | None) -> str:
    """'2 s', '150 ms', '0.41 s' -> '410 ms'; '-' for None."""
    if value is None:
        return "-"
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"
