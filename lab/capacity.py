"""Capacity under a latency target: how many users (or requests per second) each engine serves while its
latency percentiles stay within the target.

    python -m lab capacity --slo ttft_p95=2s,tpot_p95=150ms [--engines hf,vllm] [--max-users N] --out DIR

The search policy is pure and separate from the I/O: ``next_level`` reads the levels probed so far (each met or
not) and names the next one, or None when the answer is known. Closed loop (users), it doubles the users from 1
until a level misses the target, then bisects between the last level that met it and the first that missed, down
to adjacent levels; it stops at --max-users (capacity "at least" that many). With --rate-search it does the same
on an open-loop request rate from --start-rate (halving first while the start misses), until the bracket is
within ``RATE_RESOLUTION`` of its top. ``search`` drives any ``probe(level, repeat)`` coroutine through it, so the
tests run it on a fake probe and the CLI on the lab's engines (``run_level``, as ``bench`` runs a level).
``run_capacity`` is the one runner on a session: the CLI calls it, and so does the page's Capacity tab, through the
experiment lab.experiments.capacity_search (its Params are the CLI's options; refusals name them as ``names`` says),
and a notebook through ``capacity_search`` (a started session in, capacity.json's dict out).

A probe's size: closed loop, every user sends at least --requests-per-user (3) and the probe at least
--min-requests (20) in all, so that the 1-user probe's p95 rests on 20 requests, not 3 (a p95 of 20 samples still
moves with one slow request: the margin below repeats the doubtful ones). Open loop, a probe schedules at least
--min-requests and at least ``RATE_PROBE_S`` seconds of arrivals. A probe whose percentile sits within ``NEAR``
(10%) of a limit is run once more, and its level is decided on the mean of the two runs' percentiles; both runs
are kept. A failed request counts as a miss above every limit (a p95 is None when the rank falls among them).

Little's law (L = throughput x W) is checked per probe over its steady window: closed loop, from the moment every
user has a request in the system to the first user with nothing left (the driver's ``user_id`` says whose each
request is); open loop, the span of the arrivals. The measured time-average number in the system is set against
the computed throughput x mean time in system. A probe is steady (judged) when the window's edges can move that
agreement by at most ``STEADY_EDGE`` (``littles_law`` derives the bound): a rule on the window, not on the
agreement; a steady probe agrees when within ``AGREE``.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

from lab.config import DECIMAL, MAX_RATE, MAX_REQUESTS, MAX_USERS, SLO_METRICS, LoadConfig, RunPlan, parse_slo
from lab.engines import registry
from lab.engines.base import EngineFault
from lab.environment import read_device, versions
from lab.metrics import e2e_from_schedule_s, itls_s, percentile, ratio_pairs, summarize, tpot_s, ttft_from_schedule_s
from lab.runs import REQUEST_COLUMNS, SETTLE_S, RunResult, request_rows, run_level, warm_up
from lab.status import RequestStatus, RunStatus
from lab.tasks import TaskResult, supervise

log = logging.getLogger(__name__)

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


# -- targets ---------------------------------------------------------------------------------------------------

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


# -- the search policy (pure) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Space:
    """Where a search looks: from ``start``, doubling up to ``most`` or halving down to ``least``; whole levels
    (users) stop at adjacent ones, rates when the bracket is within ``resolution`` of its top."""

    start: float
    most: float
    least: float
    whole: bool = True
    resolution: float = 1.0


def users_space(most: int) -> Space:
    """Closed loop: 1, 2, 4, ... users up to ``most``."""
    return Space(1, most, 1)


def rate_space(start: float, most: float) -> Space:
    """Open loop: requests per second from ``start`` up to ``most`` (down to start / RATE_FLOOR)."""
    return Space(start, most, start / RATE_FLOOR, whole=False, resolution=RATE_RESOLUTION)


def next_level(space: Space, outcomes: dict[float, bool]) -> float | None:
    """The next level to probe, given each level probed so far and whether it met the target; None when the
    capacity is known (a bracket narrow enough, the top met, or the bottom missed). A level that met the target
    above the first one that missed (noise) is ignored."""
    if not outcomes:
        return space.start
    passed = sorted(level for level, ok in outcomes.items() if ok)
    failed = sorted(level for level, ok in outcomes.items() if not ok)
    if not failed:
        return _up(space, passed[-1])
    below = [level for level in passed if level < failed[0]]
    return _between(space, below[-1], failed[0]) if below else _down(space, failed[0])


def _up(space: Space, top: float) -> float | None:
    return None if top >= space.most else _level(space, min(top * 2, space.most))


def _down(space: Space, low: float) -> float | None:
    return None if low <= space.least else _level(space, max(low / 2, space.least))


def _between(space: Space, low: float, high: float) -> float | None:
    return None if narrow(space, low, high) else _level(space, (low + high) / 2)


def narrow(space: Space, low: float, high: float) -> bool:
    """Whether the bracket [low, high) is as tight as the search goes."""
    return high - low <= (space.resolution if space.whole else space.resolution * high)


def _level(space: Space, value: float) -> float:
    return int(value) if space.whole else round(value, 6)


def capacity_of(space: Space, outcomes: dict[float, bool], finished: bool = True) -> dict:
    """The capacity the outcomes show: the largest level met below the first missed one, and how far it is
    known: ``exact`` (bracketed), ``at_least`` (the top met, or the search stopped early), ``none`` (the bottom
    missed) or ``unknown`` (stopped before any level was met)."""
    passed = sorted(level for level, ok in outcomes.items() if ok)
    failed = sorted(level for level, ok in outcomes.items() if not ok)
    below = [level for level in passed if not failed or level < failed[0]]
    value = below[-1] if below else 0
    return {"value": value, "bound": _bound(bool(below), bool(failed), finished),
            "failed_at": failed[0] if failed else None}


def _bound(met: bool, missed: bool, finished: bool) -> str:
    if not finished:
        return "at_least" if met else "unknown"
    if not missed:
        return "at_least" if met else "unknown"
    return "exact" if met else "none"


@dataclass
class ProbeResult:
    """One run of one level: each target's measured percentile (seconds; None: no value, or the rank fell among
    failed requests), the figures capacity.json keeps, and the verdicts the search gave it."""

    level: float
    values: dict[str, float | None]
    figures: dict = field(default_factory=dict)
    repeat: int = 0
    met: bool | None = None  # this run's own verdict
    near: bool = False  # a percentile within NEAR of its limit
    level_met: bool | None = None  # the level's verdict (a repeated level: on the mean of both runs)

    def to_dict(self) -> dict:
        return {"level": self.level, "repeat": self.repeat, "values": self.values, "met": self.met,
                "near": self.near, "level_met": self.level_met, **self.figures}


def meets(values: dict[str, float | None], targets: tuple[Target, ...]) -> bool:
    """Whether every target's value is known and within its limit."""
    return all(values.get(t.name) is not None and values[t.name] <= t.limit_s for t in targets)


def is_near(values: dict[str, float | None], targets: tuple[Target, ...], margin: float = NEAR) -> bool:
    """Whether some target's value lies within ``margin`` of its limit (either side)."""
    return any((v := values.get(t.name)) is not None and abs(v - t.limit_s) <= margin * t.limit_s for t in targets)


def mean_values(first: ProbeResult, second: ProbeResult) -> dict[str, float | None]:
    """Each target's mean over two runs of a level (None where either run has none)."""
    return {name: None if v is None or second.values.get(name) is None else (v + second.values[name]) / 2
            for name, v in first.values.items()}


class TimeLimit(Exception):
    """The search's time ran out (before or during a probe)."""


Probe = Callable[[float, int], Awaitable[ProbeResult]]


async def search(space: Space, targets: tuple[Target, ...], probe: Probe,
                 keep: Callable[[ProbeResult], None] | None = None, deadline: float | None = None,
                 outcomes: dict[float, bool] | None = None) -> tuple[dict[float, bool], str]:
    """Probe levels as ``next_level`` says until the capacity is known or the time runs out.

    Args:
        space: Where to look.
        targets: What each level must meet.
        probe: ``probe(level, repeat)``: run one level once (repeat 1: its second run).
        keep: Called with every finished run at once (files, progress); a cancel keeps what it got.
        deadline: time.perf_counter() past which no probe starts and a running one is cut (not kept).
        outcomes: The dict to fill (the caller's, so that a cancel leaves the finished levels in it).

    Returns:
        (level -> met, '' or TIME_LIMIT). A cancel or a probe's error propagates.
    """
    outcomes = {} if outcomes is None else outcomes
    keep = keep or (lambda run: None)
    try:
        while (level := next_level(space, outcomes)) is not None:
            await decide(level, targets, probe, keep, deadline, outcomes)
    except TimeLimit:
        return outcomes, TIME_LIMIT
    return outcomes, ""


async def decide(level: float, targets: tuple[Target, ...], probe: Probe, keep, deadline: float | None,
                 outcomes: dict[float, bool]) -> None:
    """Run a level once, and once more when it sits near a limit; whether it met the target goes into
    ``outcomes`` before ``keep`` sees the run that decided it (so what keep writes holds the verdict)."""
    first = await before(probe(level, 0), deadline)
    first.met, first.near = meets(first.values, targets), is_near(first.values, targets)
    first.level_met = first.met if not first.near else None
    if not first.near:
        outcomes[level] = first.met
    keep(first)
    if not first.near:
        return
    second = await before(probe(level, 1), deadline)
    second.met, second.near = meets(second.values, targets), is_near(second.values, targets)
    first.level_met = second.level_met = outcomes[level] = meets(mean_values(first, second), targets)
    keep(second)


async def before(coro: Awaitable, deadline: float | None):
    """Await ``coro`` unless the deadline has passed; cut it at the deadline (TimeLimit either way)."""
    if deadline is None:
        return await coro
    left = deadline - time.perf_counter()
    if left <= 0:
        coro.close()
        raise TimeLimit
    try:
        return await asyncio.wait_for(coro, left)
    except TimeoutError:
        raise TimeLimit from None


# -- what one probe measured ---------------------------------------------------------------------------------------

SAMPLES = {"ttft": ttft_from_schedule_s, "tpot": tpot_s, "e2e": e2e_from_schedule_s}  # itl: pooled gaps


def samples(records, metric: str) -> tuple[list[float], int]:
    """A metric's values over the completed requests (TTFT and E2E from the scheduled send in open loop) and the
    number of requests that did not complete (misses)."""
    done = [r for r in records if r.status == RequestStatus.OK]
    misses = len(records) - len(done)
    if metric == "itl":
        return [gap for r in done for gap in itls_s(r)], misses
    return [v for r in done if (v := SAMPLES[metric](r)) is not None], misses


def percentile_with_misses(values: list[float], misses: int, q: float) -> float | None:
    """The q-th percentile (linear between ranks, as lab.metrics) of ``values`` plus ``misses`` samples above
    every limit; None when there is no sample or the rank falls among the misses."""
    ordered = sorted(values)
    total = len(ordered) + misses
    position = (total - 1) * q / 100.0
    if not total or math.ceil(position) >= len(ordered):
        return None
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def target_values(records, targets: tuple[Target, ...]) -> dict[str, float | None]:
    """Each target's percentile, measured over one run's requests (failed ones count as misses)."""
    return {t.name: percentile_with_misses(*samples(records, t.metric), t.percentile) for t in targets}


def latency_percentiles(records, metric: str) -> dict:
    """p50, p95 and p99 of a metric over the completed requests (measured)."""
    values = samples(records, metric)[0]
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


def arrival_s(record) -> float:
    """When a request entered the system: its scheduled time in open loop, else its send."""
    return record.scheduled_s if record.scheduled_s is not None else record.send_s


def littles_law(records, users: int | None = None, rate: float | None = None, margin: float = AGREE,
                edge: float = STEADY_EDGE) -> dict:
    """Little's law (L = throughput x W) over one run's steady window (``steady_window``).

    Measured over the window: L, the time-average number of requests in the system (their time inside it over its
    length); the throughput (requests that left in it, completed or failed, over its length); W, their mean time in
    system (from the scheduled send in open loop); open loop, the arrival rate (arrivals in it over its length).
    Computed: L = throughput x W, and the agreement, computed / measured L (``agreed``: within ``margin`` of 1).

    The two differ only by the requests the window's edges cut: closed loop (think time 0: every user always has a
    request in the system, so L is the users), at most one per user at each edge, the user that opens the window
    and the one that closes it none, each by at most its time in system: the agreement is off by at most
    (1 - 1/users) x W_max / window, W_max the longest time in system of a request the window holds or cuts. Open
    loop, nothing is cut at the start (the first arrival); a stationary system has about L in flight at the end,
    so the bound is W_max / window. *Steady* (judged): that bound at most ``edge``; a rule on the window and the
    requests' lengths, never on the agreement. Recorded closed-loop levels (docs/capacity.md) reach 0.99 of the
    bound, so a looser rule would judge probes whose edges alone make them disagree. ``why``: why not steady.
    """
    ended = [r for r in records if r.end_s is not None]
    found = {"users": users, "rate": rate, "edge_limit": edge}
    window = steady_window(ended, users)
    if window is None:
        return found | {"steady": False, "agreed": None, "agreement": None, "why": no_window_words(ended, users)}
    start, end = window
    left = [r for r in ended if start < r.end_s <= end]
    if not left:
        return found | {"steady": False, "agreed": None, "agreement": None, "window_s": end - start,
                        "why": "no request left the system in its window"}
    figures = window_figures(ended, left, start, end, users)
    return figures | found | edge_verdict(figures, users, edge) | {"agreed": abs(figures["agreement"] - 1) <= margin}


def steady_window(records, users: int | None) -> tuple[float, float] | None:
    """Closed loop (``users``): from the last user's first send (every user has a request in the system) to the
    earliest last end of a user (the first user with nothing left); open loop, the span of the arrivals (the
    schedule running). None where it is empty (a user sent nothing, or it ends before it begins)."""
    if not records:
        return None
    if users is None:
        start, end = min(arrival_s(r) for r in records), max(arrival_s(r) for r in records)
    else:
        by_user = group_by_user(records)
        if len(by_user) < users:
            return None
        start = max(min(r.send_s for r in mine) for mine in by_user.values())
        end = min(max(r.end_s for r in mine) for mine in by_user.values())
    return (start, end) if end > start else None


def group_by_user(records) -> dict[int, list]:
    """The records of each closed-loop user (RequestRecord.user_id: the driver's user that sent it)."""
    by_user: dict[int, list] = {}
    for r in records:
        by_user.setdefault(r.user_id, []).append(r)
    return by_user


def no_window_words(records, users: int | None) -> str:
    """Why a run has no steady window."""
    if users is None:
        return f"its {len(records)} arrival{'' if len(records) == 1 else 's'} span no time"
    if len(group_by_user(records)) < users:
        return f"{len(group_by_user(records))} of its {users} users sent a request"
    return "its last user's first send came after its first user's last end"


def window_figures(ended, left, start: float, end: float, users: int | None) -> dict:
    """Little's law's figures over [start, end]: measured (L, throughput, W, W_max; open loop the arrival rate),
    and the computed L with its agreement."""
    length = end - start
    cut = [r for r in ended if arrival_s(r) < end and r.end_s > start]
    inside = sum(min(r.end_s, end) - max(arrival_s(r), start) for r in cut)
    mean_time = statistics.fmean(r.end_s - arrival_s(r) for r in left)
    measured, throughput = inside / length, len(left) / length
    figures = {"window_s": length, "departures": len(left), "mean_in_system": measured,
               "throughput_req_s": throughput, "mean_time_in_system_s": mean_time,
               "longest_in_system_s": max(r.end_s - arrival_s(r) for r in cut),
               "computed_in_system": throughput * mean_time, "agreement": throughput * mean_time / measured}
    if users is None:
        figures["arrival_rate_req_s"] = sum(1 for r in ended if start <= arrival_s(r) < end) / length
    return figures


def edge_bound(figures: dict, users: int | None) -> float:
    """The most the window's edges can move the agreement (computed): (1 - 1/users) x W_max / window closed loop,
    W_max / window open loop."""
    share = 1.0 if users is None else 1 - 1 / users
    return share * figures["longest_in_system_s"] / figures["window_s"]


def edge_verdict(figures: dict, users: int | None, edge: float) -> dict:
    """Steady when the edges can move the agreement by at most ``edge``; else why not, in numbers."""
    bound = edge_bound(figures, users)
    spans = figures["window_s"] / figures["longest_in_system_s"]
    why = "" if bound <= edge else (f"its window, {seconds_words(figures['window_s'])}, spans {spans:.2g}x its "
                                    f"longest request, so its edges could move the agreement by {percent_words(bound)}")
    return {"edge_bound": bound, "steady": bound <= edge, "why": why}


# -- the plan ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CapacityPlan:
    """A capacity search: the targets, the engines, the load every probe shares, and its bounds.

    ``load`` holds the workload, output length, warm-up, seed, think time and the per-request goodput limits;
    each probe replaces its users, requests and rate (``probe_load``). ``max_users``: the most users probed
    (closed loop), or the cap on requests in flight (open loop).
    """

    targets: tuple[Target, ...]
    engines: tuple[str, ...]
    load: LoadConfig
    max_users: int = MAX_USERS
    requests_per_user: int = REQUESTS_PER_USER
    min_requests: int = MIN_REQUESTS
    rate_search: bool = False
    start_rate: float = 1.0
    max_rate: float = MAX_RATE
    time_limit_s: float = DEFAULT_TIME_LIMIT_S

    @property
    def unit(self) -> str:
        return "req/s" if self.rate_search else "users"

    def space(self) -> Space:
        return rate_space(self.start_rate, self.max_rate) if self.rate_search else users_space(self.max_users)

    def slo_text(self) -> str:
        """The targets as --slo takes them."""
        return ",".join(f"{t.name}={t.limit_s * 1000:g}ms" if t.limit_s < 1 else f"{t.name}={t.limit_s:g}s"
                        for t in self.targets)


def per_user(plan: CapacityPlan, users: int) -> int:
    """Requests each user sends in a probe: --requests-per-user, more where the probe would send < --min-requests."""
    return max(plan.requests_per_user, math.ceil(plan.min_requests / users))


def rate_requests(plan: CapacityPlan, rate: float) -> int:
    """Requests an open-loop probe schedules: --min-requests, at least RATE_PROBE_S seconds of them, at most one
    under a level's limit."""
    return min(max(plan.min_requests, math.ceil(rate * RATE_PROBE_S)), plan.load.max_requests - 1)


def probe_load(plan: CapacityPlan, level: float) -> LoadConfig:
    """The LoadConfig of one probe (validated): ``level`` users, or ``level`` requests per second."""
    if plan.rate_search:
        return dataclasses.replace(plan.load, users=(plan.max_users,), requests_per_user=None, rate=level,
                                   duration_s=rate_requests(plan, level) / level, repeats=1)
    return dataclasses.replace(plan.load, users=(int(level),), requests_per_user=per_user(plan, int(level)),
                               duration_s=None, rate=None, repeats=1)


def goodput_slo(targets: tuple[Target, ...]) -> tuple[tuple[str, float], ...]:
    """The targets as per-request limits for goodput (lab.metrics.meets_slo: ttft, tpot, e2e; ITL has none)."""
    return tuple((t.metric, t.limit_s) for t in targets if t.metric in SLO_METRICS)


def capacity_plan(slo: str, engines: tuple[str, ...], config, *, workload: str = "mixed", max_users: int = MAX_USERS,
                  requests_per_user: int = REQUESTS_PER_USER, min_requests: int = MIN_REQUESTS,
                  output_len: int | None = None, warmup: int = 2, seed: int = 0, think_s: float = 1.0,
                  rate_search: bool = False, start_rate: float = 1.0, max_rate: float = MAX_RATE,
                  time_limit_s: float = DEFAULT_TIME_LIMIT_S, names: dict[str, str] = FLAGS) -> CapacityPlan:
    """A validated CapacityPlan: every rule checked here, before any engine loads (the largest probe's load and
    RunPlan included: engines, workload, lengths against max_model_len). ``config`` None checks every rule but the
    engines' and the lengths' (they need the engine config); ``names``: how a refusal names each bound (FLAGS).

    Raises:
        ValueError: naming the value, the limit and the way out.
    """
    targets = parse_targets(slo, names["slo"])
    check_bounds(max_users, requests_per_user, min_requests, time_limit_s, names)
    check_rates(start_rate, max_rate, rate_search, names)
    load = LoadConfig(users=(max_users,), workload=workload, requests_per_user=requests_per_user,
                      output_len=output_len, warmup_requests=warmup, seed=seed, think_s=think_s,
                      slo=goodput_slo(targets))
    plan = CapacityPlan(targets, tuple(engines), load, max_users, requests_per_user, min_requests, rate_search,
                        start_rate, max_rate, time_limit_s)
    if config is not None:
        top = plan.max_rate if rate_search else plan.max_users
        RunPlan(engines=plan.engines, load=probe_load(plan, top), engine=config)
    return plan


def check_bounds(max_users: int, requests_per_user: int, min_requests: int, time_limit_s: float,
                 names: dict[str, str] = FLAGS) -> None:
    """--max-users, --requests-per-user, --min-requests and --time-limit within the lab's limits (each refusal
    names its bound as ``names`` says)."""
    users, per, least, limit = (names[k] for k in ("max_users", "requests_per_user", "min_requests", "time_limit"))
    if not 1 <= max_users <= MAX_USERS:
        raise ValueError(f"{users} must be from 1 to {MAX_USERS} (the lab's limit of users per level), "
                         f"not {max_users}")
    if requests_per_user < 1:
        raise ValueError(f"{per} (requests per user in a probe) must be at least 1, not {requests_per_user}")
    if not 1 <= min_requests <= MAX_REQUESTS:
        raise ValueError(f"{least} must be from 1 to {MAX_REQUESTS}, not {min_requests}")
    if max_users * requests_per_user > MAX_REQUESTS:
        raise ValueError(f"{users} {max_users} x {per} {requests_per_user} = "
                         f"{max_users * requests_per_user} requests in the top probe, past the limit of "
                         f"{MAX_REQUESTS} per level: lower one of them")
    if not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise ValueError(f"{limit} must be above 0 and at most {MAX_TIME_LIMIT_S:g} seconds (a day), "
                         f"not {time_limit_s:g}")


def check_rates(start: float, most: float, rate_search: bool, names: dict[str, str] = FLAGS) -> None:
    """--start-rate and --max-rate: above 0, at most MAX_RATE, the start at most the top."""
    for name, value in ((names["start_rate"], start), (names["max_rate"], most)):
        if not 0 < value <= MAX_RATE:
            raise ValueError(f"{name} must be above 0 and at most {MAX_RATE:g} requests per second, not {value:g}")
    if rate_search and start > most:
        raise ValueError(f"{names['start_rate']} {start:g} is above {names['max_rate']} {most:g}: lower the start "
                         f"or raise the top")


# -- the result ----------------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class CapacityResult(TaskResult):
    """A capacity search over every engine, live while it runs and kept (partial) when it fails or is cancelled.

    ``searches``: per engine, the levels probed (level -> met) and how its search ended (running, done,
    TIME_LIMIT, cancelled, failed).
    """

    KIND: ClassVar[str] = "capacity"
    KEPT: ClassVar[str] = "finished probes kept"
    STORED_AS_IT_GOES: ClassVar[bool] = True

    plan: CapacityPlan
    probes: list[tuple[str, ProbeResult]] = field(default_factory=list)
    searches: dict[str, dict] = field(default_factory=dict)
    run: RunResult | None = None  # every probe's level and requests (requests.csv)
    levels: list = field(default_factory=list)  # each probe's LevelResult, in the order of ``probes``
    agreement: list = field(default_factory=list)
    origin_s: float = field(default_factory=time.perf_counter)
    ended_s: float | None = None

    def name(self) -> str:
        """The targets, as --slo takes them."""
        return self.plan.slo_text()

    def to_dict(self) -> dict:
        """As capacity.json holds it."""
        return capacity_dict(self)


def capacity_dict(result: CapacityResult) -> dict:
    """capacity.json: every probe, each engine's capacity, the ratios and the computed sentences."""
    plan = result.plan
    capacities = {name: engine_capacity(result, name) for name in plan.engines}
    data = {"capacity_id": result.id, "started_at": result.started_at, "ended_at": result.ended_at,
            "status": result.status, "error": result.error, "mode": "rate" if plan.rate_search else "users",
            "unit": plan.unit, "slo": plan.slo_text(), "targets": [t.to_dict() for t in plan.targets],
            "engines": list(plan.engines), "settings": settings(plan), "capacity": capacities,
            "ratios": {f"{top}/{base}": capacity_ratio(capacities[top], capacities[base])
                       for top, base in ratio_pairs(plan.engines)},
            "probes": [{"engine": name, **probe.to_dict()} for name, probe in result.probes],
            "model": result.model, "device": result.device, "versions": result.versions,
            "engine_args": result.engine_args, "agreement": result.agreement,
            "wall_s": None if result.ended_s is None else result.ended_s - result.origin_s}
    return data | {"sentences": capacity_answer(data)}


def settings(plan: CapacityPlan) -> dict:
    """The search's bounds and the load every probe shares."""
    load = plan.load
    return {"workload": load.workload, "output_len": load.output_len, "warmup_requests": load.warmup_requests,
            "seed": load.seed, "think_s": load.think_s, "goodput_slo": dict(load.slo), "max_users": plan.max_users,
            "requests_per_user": plan.requests_per_user, "min_requests": plan.min_requests,
            "start_rate": plan.start_rate if plan.rate_search else None,
            "max_rate": plan.max_rate if plan.rate_search else None, "time_limit_s": plan.time_limit_s,
            "near_margin": NEAR, "agree_margin": AGREE, "steady_edge": STEADY_EDGE, "rate_resolution": RATE_RESOLUTION,
            "rate_probe_s": RATE_PROBE_S}


def engine_capacity(result: CapacityResult, name: str) -> dict:
    """One engine's capacity (capacity_of), how its search ended and the levels it probed."""
    found = result.searches.get(name, {"outcomes": {}, "ended": WAITING if result.status == RunStatus.RUNNING
                                       else "not run"})
    finished = found["ended"] == "done"
    space = result.plan.space()
    return {**capacity_of(space, found["outcomes"], finished), "ended": found["ended"], "unit": result.plan.unit,
            "most": space.most, "least": space.least,
            "levels": [{"level": level, "met": ok} for level, ok in found["outcomes"].items()]}


def capacity_ratio(top: dict, base: dict) -> dict:
    """``top``'s capacity over ``base``'s (computed), and how far it is known: exact, at_least, at_most, or
    unknown (both lower bounds); None where either served nothing."""
    if not top["value"] or not base["value"]:
        return {"value": None, "bound": "none"}
    bounds = {("exact", "exact"): "exact", ("at_least", "exact"): "at_least", ("exact", "at_least"): "at_most"}
    return {"value": top["value"] / base["value"], "bound": bounds.get((top["bound"], base["bound"]), "unknown")}


# -- sentences (computed from capacity.json) -----------------------------------------------------------------------

def level_words(value: float, unit: str) -> str:
    """'3 users', '1 user', '1.25 req/s'."""
    if unit == "users":
        return f"{value:g} user" + ("" if value == 1 else "s")
    return f"{value:.3g} req/s"


def times_words(ratio: float) -> str:
    """'16x', '1.5x'."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def capacity_answer(data: dict) -> list[str]:
    """The computed sentences of a capacity result: the headline, what broke each engine's target first, Little's
    law, the repeats, early stops."""
    lines = [headline(data), *limit_lines(data), little_line(data), repeat_line(data), *stop_lines(data)]
    return [line for line in lines if line]


def capacity_caption(data: dict) -> str:
    """The sentences as the page shows them under its figure (one paragraph each), computed again from the data:
    a capacity.json written before a sentence existed gets it too."""
    return "\n\n".join(capacity_answer(data))


def headline(data: dict) -> str:
    """'Under ttft_p95 <= 2 s and tpot_p95 <= 150 ms, HF served 3 users and vLLM 48 users: 16x the capacity
    (computed).', branching on each engine's bound."""
    targets = " and ".join(f"{t['name']} <= {seconds_words(t['limit_s'])}" for t in data["targets"])
    served = [served_words(name, data["capacity"][name]) for name in data["engines"]]
    ratios = [ratio_words(key, found, data) for key, found in data.get("ratios", {}).items()]
    tail = "; ".join(r for r in ratios if r)
    return f"Under {targets}, {join_words(served)}" + (f": {tail}." if tail else ".")


def join_words(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def served_words(name: str, found: dict) -> str:
    """What one engine served, said by its bound (while the search goes: so far)."""
    label, unit, verb = registry.label(name), found["unit"], "served" if found["unit"] == "users" else "sustained"
    value = level_words(found["value"], unit)
    if found["ended"] in (RUNNING, WAITING):
        return so_far_words(label, verb, found)
    if found["bound"] == "exact":
        return f"{label} {verb} {value} ({level_words(found['failed_at'], unit)} missed it)"
    if found["bound"] == "none":
        return f"{label} {verb} none (it missed the target at {level_words(found['least'], unit)})"
    if found["bound"] == "unknown":
        return unknown_words(label, found)
    if found["ended"] == "done":
        return f"{label} {verb} at least {value} (the most probed: every level met the target)"
    cap = f", fewer than {level_words(found['failed_at'], unit)}" if found["failed_at"] is not None else ""
    return f"{label} {verb} at least {value}{cap} (its search stopped early: {found['ended']})"


def unknown_words(label: str, found: dict) -> str:
    """An engine whose search ended with no level that met the target and none that missed it: not measured."""
    if found["ended"] == "not run":
        return f"{label} was not probed (the run ended before its turn)"
    if not found.get("levels"):
        return f"{label} was not measured (its search ended, {found['ended']}, before its first probe finished)"
    lowest = level_words(min(level["level"] for level in found["levels"]), found["unit"])
    return (f"{label} missed the target at every level probed, down to {lowest}, and its search ended "
            f"({found['ended']}) before one met it: below {lowest}, if any")


def so_far_words(label: str, verb: str, found: dict) -> str:
    """An engine whose search goes on (or has not begun): what its levels show so far."""
    if found["ended"] == WAITING:
        return f"{label} waits its turn"
    missed = f"; {level_words(found['failed_at'], found['unit'])} missed it" if found["failed_at"] is not None else ""
    if found["value"]:
        return f"{label} {verb} {level_words(found['value'], found['unit'])} so far (its search goes on{missed})"
    return f"{label}'s search goes on (no level met the target yet{missed})"


def ratio_words(key: str, found: dict, data: dict) -> str:
    """One capacity ratio, said by its bound ('' where it says nothing)."""
    top, base = key.split("/", 1)
    caps = data["capacity"]
    if found["value"] is None:
        return _none_words(registry.label(top), registry.label(base), caps[top], caps[base])
    value, bound = found["value"], found["bound"]
    if bound == "exact":
        return "the same capacity" if value == 1 else f"{times_words(value)} the capacity (computed)"
    if bound in ("at_least", "at_most"):
        return f"{bound.replace('_', ' ')} {times_words(value)} the capacity (computed from a bound)"
    return ""


def _none_words(top: str, base: str, top_cap: dict, base_cap: dict) -> str:
    if top_cap["value"] and base_cap["bound"] == "none":
        return f"{top} met the target where {base} met it at no level"
    if base_cap["value"] and top_cap["bound"] == "none":
        return f"{base} met the target where {top} met it at no level"
    return "neither met it" if top_cap["bound"] == base_cap["bound"] == "none" else ""


def little_line(data: dict) -> str:
    """Little's law over the probes: how many were steady (judged), how many of those agreed within AGREE, why any
    steady one disagreed and why the others were not steady (computed from each probe's ``little``)."""
    probes = [p for p in data["probes"] if p.get("little")]
    if not probes:
        return ""
    if any("edge_limit" not in p["little"] for p in probes):
        return old_little_line(data)
    steady = [p for p in probes if p["little"]["steady"]]
    agreed = [p for p in steady if p["little"]["agreed"]]
    parts = [f"Little's law (L = throughput x mean time in system, computed, against the measured time-average "
             f"number in the system, over each probe's steady window): {len(steady)} of {len(probes)} probes were "
             f"steady (their windows' edges could move the agreement by at most {STEADY_EDGE:.0%})",
             agreed_words(agreed, steady)]
    parts += [disagreed_words(p, data) for p in steady if not p["little"]["agreed"]]
    parts.append(short_words([p for p in probes if not p["little"]["steady"] and "edge_bound" in p["little"]], data))
    parts += [f"{probe_words(p, data)} was not judged ({p['little']['why']})" for p in probes
              if not p["little"]["steady"] and "edge_bound" not in p["little"]]
    return "; ".join(part for part in parts if part) + "."


def short_words(probes: list[dict], data: dict) -> str:
    """The probes whose windows were too short to judge: which, how many times their longest request their windows
    span, and how far their edges could move the agreement (ranges over them)."""
    if not probes:
        return ""
    spans = [p["little"]["window_s"] / p["little"]["longest_in_system_s"] for p in probes]
    bounds = [p["little"]["edge_bound"] for p in probes]
    many = len(probes) > 1
    return (f"{len(probes)} {'were' if many else 'was'} not steady ({engine_levels_words(probes, data)}): "
            f"{'their windows span' if many else 'its window spans'} {span_range(spans, '.2g', 'x')} "
            f"{'their' if many else 'its'} longest request, so {'their' if many else 'its'} edges could move the "
            f"agreement by {span_range([100 * b for b in bounds], '.3g', '%')}")


def percent_words(share: float) -> str:
    """0.104 -> '10.4%' (three figures: a bound just past 10% does not read as 10%)."""
    return f"{100 * share:.3g}%"


def span_range(values: list[float], spec: str, unit: str) -> str:
    """'1.1-3.9x', or '2.2x' for one value (or equal ones)."""
    low, high = format(min(values), spec), format(max(values), spec)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def engine_levels_words(probes: list[dict], data: dict) -> str:
    """'HF at 2 users and vLLM at 4, 8 and 6 users': each engine's levels in the order probed, once each."""
    parts = []
    for name in dict.fromkeys(p["engine"] for p in probes):
        levels = list(dict.fromkeys(p["level"] for p in probes if p["engine"] == name))
        numbers = [level_words(v, data["unit"]).split(" ", 1) for v in levels]
        unit = numbers[-1][1] if len(numbers) == 1 else data["unit"]  # '1 user', '2 and 4 users'
        parts.append(f"{registry.label(name)} at {join_words([n for n, _ in numbers])} {unit}")
    return join_words(parts)


def probe_words(probe: dict, data: dict) -> str:
    """'HF at 8 users' (', second run' for a repeat)."""
    again = ", second run" if probe["repeat"] else ""
    return f"{registry.label(probe['engine'])} at {level_words(probe['level'], data['unit'])}{again}"


def agreed_words(agreed: list[dict], steady: list[dict]) -> str:
    """How many steady probes agreed within AGREE, with the range of their agreement."""
    if not steady:
        return ""
    values = [p["little"]["agreement"] for p in agreed]
    low, high = (f"{v:.2f}" for v in (min(values, default=0), max(values, default=0)))
    spread = "" if not values else f" (computed / measured {low}" + ("" if low == high else f"-{high}") + ")"
    share = "all of them" if len(agreed) == len(steady) else f"{len(agreed)} of them"
    return f"{share} agreed within {AGREE:.0%}{spread}"


def disagreed_words(probe: dict, data: dict) -> str:
    """A steady probe that disagreed: its agreement, the most its edges explain, and what the rest is."""
    little = probe["little"]
    head = (f"{probe_words(probe, data)} disagreed: computed / measured {little['agreement']:.2f}, of which its "
            f"edges explain at most {percent_words(little['edge_bound'])}")
    if little["users"] and little["mean_in_system"] < little["users"] * (1 - AGREE):
        return (f"{head}; it held {little['mean_in_system']:.2g} requests in the system on average for "
                f"{little['users']} users (think time or the client kept users out of it)")
    if little.get("arrival_rate_req_s") and little["throughput_req_s"] < little["arrival_rate_req_s"] * (1 - AGREE):
        return (f"{head}; it finished {little['throughput_req_s']:.3g} req/s of {little['arrival_rate_req_s']:.3g} "
                f"arriving (measured): it fell behind the schedule, and more requests were in flight at the "
                f"window's end than on average")
    return head


def old_little_line(data: dict) -> str:
    """A search stored before the steady window: its check compared the computed L with the users set (closed
    loop) and called a probe steady when they agreed."""
    checked = [p for p in data["probes"] if (p.get("little") or {}).get("agreement") is not None]
    if not checked:
        return ""
    steady = sum(1 for p in checked if p["little"]["steady"])
    against = "the users set" if data["mode"] == "users" else "the measured mean number in the system"
    return (f"Little's law (stored before the steady-window rule; computed L against {against}) agreed within "
            f"{AGREE:.0%} in {steady} of {len(checked)} probes, over windows from each probe's first arrival to "
            f"its last end.")


def repeat_line(data: dict) -> str:
    """How many levels sat near a limit and were run twice."""
    repeated = [p for p in data["probes"] if p["repeat"] == 1]
    if not repeated:
        return ""
    names = ", ".join(f"{registry.label(p['engine'])} at {level_words(p['level'], data['unit'])}" for p in repeated)
    return (f"{len(repeated)} level{'s' if len(repeated) > 1 else ''} sat within {NEAR:.0%} of a limit and ran "
            f"twice ({names}); each was decided on the mean of its two runs' percentiles.")


def stop_lines(data: dict) -> list[str]:
    """An engine whose search stopped early: its capacity is a lower bound."""
    return [f"{registry.label(name)}'s search ended early ({found['ended']}): its capacity is a lower bound."
            for name, found in data["capacity"].items() if found["ended"] not in ("done", "not run", RUNNING, WAITING)
            and found["bound"] == "at_least"]


def limit_lines(data: dict) -> list[str]:
    """Per engine, which target broke first (at the lowest level that missed it) or, where no level missed, which
    came nearest its limit: from the probes' measured percentiles."""
    return [line for name in data["engines"] if (line := limit_line(name, data))]


def limit_line(name: str, data: dict) -> str:
    """One engine's: what broke its target first, or what came nearest ('' before its first probe)."""
    runs = [p for p in data["probes"] if p["engine"] == name]
    failed_at = data["capacity"][name]["failed_at"]
    if not runs:
        return ""
    if failed_at is None:
        return nearest_words(name, runs, data)
    return broke_words(name, [p for p in runs if p["level"] == failed_at], data)


def target_label(target: dict) -> str:
    """'TTFT p95'."""
    return f"{target['metric'].upper()} p{target['percentile']:g}"


def level_values(runs: list[dict]) -> dict[str, float | None]:
    """A level's target values as its verdict read them: one run's, or the mean of its two (None where one has
    none)."""
    if len(runs) == 1:
        return runs[0]["values"]
    return {k: None if v is None or runs[1]["values"].get(k) is None else (v + runs[1]["values"][k]) / 2
            for k, v in runs[0]["values"].items()}


def broke_words(name: str, runs: list[dict], data: dict) -> str:
    """'HF broke the target first on TTFT p95 (5.13 s against 2 s) at 2 users, while TPOT p95 held (42.3 ms,
    within 100 ms); measured.'"""
    values = level_values(runs)
    broke, held = [], []
    for t in data["targets"]:
        value = values.get(t["name"])
        if value is None:
            broke.append(f"{target_label(t)} (no value: its rank fell among failed requests)")
        elif value > t["limit_s"]:
            broke.append(f"{target_label(t)} ({seconds_words(value)} against {seconds_words(t['limit_s'])})")
        else:
            held.append(f"{target_label(t)} ({seconds_words(value)}, within {seconds_words(t['limit_s'])})")
    both = ", the mean of its two runs there" if len(runs) > 1 else ""
    kept = f", while {join_words(held)} held" if held else ""
    return (f"{registry.label(name)} broke the target first on {join_words(broke)} at "
            f"{level_words(runs[0]['level'], data['unit'])}{kept} (measured{both}).")


def nearest_words(name: str, runs: list[dict], data: dict) -> str:
    """An engine that missed at no level probed: the target that came nearest its limit, and where."""
    shares = [(p["values"][t["name"]] / t["limit_s"], p, t) for p in runs for t in data["targets"]
              if p["values"].get(t["name"]) is not None]
    if not shares:
        return ""
    share, probe, t = max(shares, key=lambda found: found[0])
    return (f"{registry.label(name)} missed the target at no level probed; nearest its limit came "
            f"{target_label(t)}: {seconds_words(probe['values'][t['name']])} at "
            f"{level_words(probe['level'], data['unit'])}, {share:.0%} of its {seconds_words(t['limit_s'])} "
            f"(measured; the share computed).")


def probe_line(name: str, probe: ProbeResult, plan: CapacityPlan) -> str:
    """One progress line: 'capacity: vllm probe 4 users (20 requests): p95 TTFT 410 ms (target 2 s) ... met'."""
    parts = [f"{t.metric.upper() if t.metric != 'e2e' else 'E2E'} p{t.percentile:g} "
             f"{seconds_words(probe.values.get(t.name))} (target {seconds_words(t.limit_s)})" for t in plan.targets]
    verdict = "met" if probe.met else "missed"
    if probe.repeat:
        verdict += f"; on the mean of both runs: {'met' if probe.level_met else 'missed'}"
    elif probe.near:
        verdict += " (near a limit: running it once more)"
    again = ", second run" if probe.repeat else ""
    return (f"capacity: {name} probe {level_words(probe.level, plan.unit)}{again} "
            f"({probe.figures.get('completed', 0)} of {probe.figures.get('requests', 0)} requests done): "
            f"{', '.join(parts)}: {verdict}")


# -- running it on a session ---------------------------------------------------------------------------------------

def new_capacity(session, plan: CapacityPlan) -> CapacityResult:
    """An empty result stamped with the session's model, device and versions."""
    return CapacityResult(plan=plan, model=session.check.model, device=read_device(session.check.device).to_dict(),
                          versions=versions())


def _nothing(*args) -> None:
    """A hook that watches nothing."""


@dataclass(frozen=True)
class Hooks:
    """How a caller watches a search: ``update`` with the result after every probe and at the end (the CLI writes
    capacity.json and stores it; the page's experiment refreshes its fields), ``probe`` with each finished run (the
    CLI's progress lines), ``step`` with the result when a step begins (engine start, warm-up, a probe: its
    ``message`` is the page's progress line)."""

    update: Callable[[CapacityResult], None] = _nothing
    probe: Callable[[str, ProbeResult], None] = _nothing
    step: Callable[[CapacityResult], None] = _nothing

    def say(self, result: CapacityResult, message: str) -> None:
        """A new step: its message on the result, and the ``step`` hook told."""
        result.message = message
        self.step(result)


async def run_capacity(session, plan: CapacityPlan, result: CapacityResult | None = None,
                       on_update: Callable[[CapacityResult], None] | None = None,
                       on_probe: Callable[[str, ProbeResult], None] | None = None,
                       on_step: Callable[[CapacityResult], None] | None = None) -> CapacityResult:
    """Start the session's engines (if not started), then search each engine in turn; never loses a probe. The one
    runner of a capacity search: ``python -m lab capacity`` and the page's experiment (capacity_search) call it.

    Args:
        session: A LabSession holding the plan's engines (started here if it is not).
        plan: Targets, engines, load and bounds.
        result: The result to fill (to watch it live), else a new one.
        on_update: Called with the result after every probe and at the end (write the files, store it).
        on_probe: Called with each finished run (progress lines).
        on_step: Called with the result when a step begins (its message says which).

    Returns:
        The result: ok (time-limited searches included: each says so), failed or cancelled, every finished
        probe kept.
    """
    result = result or new_capacity(session, plan)
    hooks = Hooks(on_update or _nothing, on_probe or _nothing, on_step or _nothing)
    await supervise(result, search_session(session, plan, result, hooks), salvage=lambda: close(result))
    result.ended_s = time.perf_counter()
    hooks.update(result)
    return result


async def capacity_search(session, slo: str, engines: tuple[str, ...] | None = None, **options) -> dict:
    """Search each engine's capacity on a started session and return capacity.json's dict: a notebook's way in
    (``await capacity_search(session, "ttft_p95=5s,tpot_p95=400ms", max_users=16)``), run_capacity underneath.

    Args:
        session: A started LabSession (lab.notebook.start_session); its engines stay up.
        slo: The targets, as --slo takes them.
        engines: Which of the session's engines, in order (default: all it holds).
        **options: capacity_plan's keywords: max_users, workload, requests_per_user, min_requests, output_len,
            warmup, seed, think_s, rate_search, start_rate, max_rate, time_limit_s.

    Raises:
        ValueError: a bad target or bound, or an engine the session does not hold, before any probe.
    """
    chosen = session_engines(session, engines or tuple(session.engines))
    plan = capacity_plan(slo, chosen, session.config, names=KEYWORDS, **options)
    return (await run_capacity(session, plan)).to_dict()


def session_engines(session, names: tuple[str, ...], field: str = "engines") -> tuple[str, ...]:
    """``names``, each loaded in the session (ValueError naming the first that is not, and the choices)."""
    missing = [n for n in names if n not in session.engines]
    if missing:
        raise ValueError(f"{field}: {missing[0]!r} is not loaded in this session; choose from "
                         f"{', '.join(session.engines)}")
    return tuple(names)


async def search_session(session, plan: CapacityPlan, result: CapacityResult, hooks: Hooks) -> None:
    """Start the engines, then each engine's search, the time left shared among the engines still to search."""
    if not session.engines:
        from lab.session import settle_heap

        hooks.say(result, "starting the engines")
        await session.start()
        settle_heap()
    stamp(result, session)
    deadline = result.origin_s + plan.time_limit_s
    for index, name in enumerate(plan.engines):
        if index and registry.spec(plan.engines[index - 1]).kv_pool:
            await asyncio.sleep(SETTLE_S)  # vLLM's CPU worker busy-spins ~1 s after its last request
        share = (deadline - time.perf_counter()) / (len(plan.engines) - index)
        await search_engine(session, plan, result, name, time.perf_counter() + share, hooks)


def stamp(result: CapacityResult, session) -> None:
    """The started session's engine args, agreement and the load run that holds every probe's requests."""
    result.engine_args = {name: info.args for name, info in session.info.items()}
    result.agreement = session.agreement.to_dict() if session.agreement else []
    top = plan_top(result.plan, session.config)
    result.run = session.new_result(top)


def plan_top(plan: CapacityPlan, config) -> RunPlan:
    """The RunPlan of the largest probe (the load run's plan: every probe's level is appended to it)."""
    return RunPlan(engines=plan.engines, load=probe_load(plan, plan.max_rate if plan.rate_search else plan.max_users),
                   engine=config)


async def search_engine(session, plan: CapacityPlan, result: CapacityResult, name: str, deadline: float,
                        hooks: Hooks) -> None:
    """Warm one engine up, then search its capacity (its levels kept in result.searches as they finish)."""
    found = result.searches[name] = {"outcomes": {}, "ended": RUNNING}
    engine = session.engines[name]
    hooks.say(result, f"warming up {name}")
    await warm_up(engine, session.tokenizer, RunPlan(engines=(name,), load=probe_load(plan, plan.space().start),
                                                     engine=session.config))

    def keep(probe: ProbeResult) -> None:
        result.probes.append((name, probe))
        hooks.probe(name, probe)
        hooks.update(result)

    def measure(level: float, repeat: int) -> Awaitable[ProbeResult]:
        return measure_probe(session, plan, result, name, level, repeat, hooks)

    _, stopped = await search(plan.space(), plan.targets, measure, keep, deadline, found["outcomes"])
    found["ended"] = stopped or "done"


async def measure_probe(session, plan: CapacityPlan, result: CapacityResult, name: str, level: float,
                        repeat: int, hooks: Hooks = Hooks()) -> ProbeResult:
    """Run one probe on engine ``name`` as bench runs a level (run_level); a cut probe aborts what it sent."""
    engine = session.engines[name]
    if not engine.alive():
        raise EngineFault(f"{engine.fault()}, before the {level_words(level, plan.unit)} probe of {name}")
    run_plan = RunPlan(engines=(name,), load=probe_load(plan, level), engine=session.config)
    hooks.say(result, f"{name}: probe {level_words(level, plan.unit)}" + (" (second run)" if repeat else ""))
    try:
        done = await run_level(run_plan, engine, session.tokenizer, run_plan.load.users[0], result.run, (), repeat)
    except asyncio.CancelledError:
        await abort(engine)
        raise
    result.levels.append(done)
    return probe_result(plan, level, repeat, done)


async def abort(engine) -> None:
    """Abort what a cut or cancelled probe left in the engine (its failure only logged)."""
    try:
        await engine.abort_all()
    except Exception:
        log.exception("abort failed for %s", engine.name)


def probe_result(plan: CapacityPlan, level: float, repeat: int, done) -> ProbeResult:
    """A finished level as a ProbeResult: its targets' percentiles and figures (measured; Little's law computed)."""
    records, summary = done.records, done.summary or summarize(done.records, done.engine, done.users)
    rate = level if plan.rate_search else None
    figures = {"unit": plan.unit, "users": None if rate else int(level), "rate": rate, "cap": done.users,
               "status": done.status, "requests": summary.requests, "completed": summary.completed,
               "errors": summary.errors, "duration_s": summary.duration_s,
               **{f"{m}_s": latency_percentiles(records, m) for m in METRICS},
               "output_tok_s": summary.output_tok_s, "req_s": summary.req_s,
               "goodput_req_s": summary.goodput_req_s, "slo_met": summary.slo_met,
               "little": littles_law(records, None if rate else int(level), rate)}
    return ProbeResult(level=level, values=target_values(records, plan.targets), figures=figures, repeat=repeat)


def close(result: CapacityResult) -> None:
    """After a cancel or a failure: the search that was running ended so (its finished levels kept)."""
    for found in result.searches.values():
        if found["ended"] == RUNNING:
            found["ended"] = str(result.status)


# -- files ---------------------------------------------------------------------------------------------------------

def write_capacity(result: CapacityResult, out_dir: str | Path, requests: bool = True) -> dict[str, Path]:
    """Write DIR/capacity.json and (``requests``) DIR/requests.csv: every request of every probe, with its probe's
    index in capacity.json's ``probes``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "capacity.json"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=2, default=str))
    if requests and result.run is not None:
        paths["requests"] = out / "requests.csv"
        paths["requests"].write_text(requests_text(result))
    return paths


def requests_text(result: CapacityResult) -> str:
    """requests.csv: one row per request (lab.runs.request_rows), each with the probe it belongs to."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["probe", *REQUEST_COLUMNS])
    writer.writeheader()
    for index, level in enumerate(result.levels):
        one = SimpleNamespace(levels=[level], origin_s=result.run.origin_s)
        writer.writerows({"probe": index, **row} for row in request_rows(one))
    return buffer.getvalue()


LITTLE_COLUMN = "L comp/meas"  # probe_rows' column: Little's law, computed L / measured L over the steady window
PROBES_LABEL = f"Every probe (latencies in ms; {LITTLE_COLUMN}: Little's law, computed L / measured L; steady: judged)"


def probe_rows(data: dict) -> list[dict]:
    """capacity.json's probes as flat rows (the CLI's table, the report's): latencies in ms."""
    def ms(found: dict, q: str):
        value = (found or {}).get(q)
        return None if value is None else round(value * 1000, 1)

    return [{"engine": p["engine"], p["unit"]: p["level"], "run": p["repeat"] + 1, "done": p["completed"],
             "err": p["errors"], **{f"{m.upper()} {q} ms": ms(p[f"{m}_s"], q) for m in ("ttft", "tpot")
                                   for q in ("p50", "p95", "p99")},
             "out tok/s": round(p["output_tok_s"], 1), "goodput r/s": _round(p.get("goodput_req_s"), 2),
             LITTLE_COLUMN: _round(little_agreement(p["little"]), 2), "steady": steady_cell(p["little"]),
             "met": p["level_met"] if p["level_met"] is not None else p["met"]}
            for p in data["probes"]]


def little_agreement(little: dict) -> float | None:
    """Little's law's computed L over its measured L (a search stored before the steady window: over its whole
    probe)."""
    measured, computed = little.get("mean_in_system"), little.get("computed_in_system")
    return computed / measured if measured and computed is not None else None


def steady_cell(little: dict) -> bool | None:
    """Whether the window rule judged the probe steady (None: stored before the rule)."""
    return little.get("steady") if "edge_limit" in little else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def search_row(data: dict) -> dict:
    """One stored search as a row of the Results tab's list: when, the target, each engine's capacity and each
    ratio as the headline bounds them (computed), its status and id."""
    capacities = {f"{registry.label(name)} capacity": capacity_cell(found)
                  for name, found in data["capacity"].items()}
    ratios = {"/".join(registry.label(n) for n in key.split("/", 1)): ratio_cell(found)
              for key, found in data.get("ratios", {}).items()}
    return {"when": data["started_at"].replace("T", " ")[:16], "target": data["slo"], **capacities, **ratios,
            "status": data["status"], "id": data["capacity_id"]}


def capacity_cell(found: dict) -> str:
    """'3 users', '>= 16 users', 'none', '-' (not known), by the capacity's bound."""
    if found["bound"] == "none":
        return "none"
    if found["bound"] == "unknown":
        return "-"
    value = level_words(found["value"], found["unit"])
    return value if found["bound"] == "exact" else f">= {value}"


def ratio_cell(found: dict) -> str:
    """'16x', '>= 16x', '<= 2x', '-' by the ratio's bound."""
    if found["value"] is None or found["bound"] == "unknown":
        return "-"
    sign = {"exact": "", "at_least": ">= ", "at_most": "<= "}[found["bound"]]
    return f"{sign}{times_words(found['value'])}"


def format_capacity(data: dict) -> str:
    """The probes as a plain-text table, then the computed sentences (the CLI's stdout)."""
    rows = probe_rows(data)
    if not rows:
        return "\n".join(["no probe finished", *data["sentences"]])
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(_cell(r[c])) for r in rows)) for c in columns}
    lines = [" ".join(f"{c:>{widths[c]}}" for c in columns)]
    lines += [" ".join(f"{_cell(r[c]):>{widths[c]}}" for c in columns) for r in rows]
    return "\n".join([*lines, "", *data["sentences"]])


def _cell(value) -> str:
    return "-" if value is None else str(value)
