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
``run_capacity`` is the one runner on a session: ``TASK`` runs it for the CLI and for the page's Capacity tab (which
submits ``capacity_plan``'s CapacityPlan to the host; refusals name the form's fields as ``names`` says), and a
notebook calls it through ``capacity_search`` (a started session in, capacity.json's dict out).

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

from lab.capacity.little import latency_percentiles, littles_law, target_values
from lab.capacity.targets import (
    AGREE,
    DEFAULT_TIME_LIMIT_S,
    FLAGS,
    KEYWORDS,
    MAX_TIME_LIMIT_S,
    METRICS,
    MIN_REQUESTS,
    NEAR,
    RATE_FLOOR,
    RATE_PROBE_S,
    RATE_RESOLUTION,
    REQUESTS_PER_USER,
    RUNNING,
    STEADY_EDGE,
    TIME_LIMIT,
    WAITING,
    Target,
    parse_targets,
    seconds_words,
)
from lab.capacity.words import capacity_answer, level_words, times_words
from lab.config import MAX_RATE, MAX_REQUESTS, MAX_USERS, SLO_METRICS, LoadConfig, RunPlan
from lab.engines import registry
from lab.engines.base import EngineFault
from lab.environment import read_device, versions
from lab.metrics import ratio_pairs, summarize
from lab.runs import REQUEST_COLUMNS, SETTLE_S, RunResult, request_rows, run_level, warm_up
from lab.status import RunStatus
from lab.tasks import TaskResult, TaskSpec, nothing, supervise

log = logging.getLogger(__name__)

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
    capacity.json and stores it; the page's host stores it and redraws), ``probe`` with each finished run (the
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
    runner of a capacity search: ``TASK`` runs it for ``python -m lab capacity`` and the page's Capacity tab.

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
        done = await run_level(run_plan, engine, session.tokenizer, run_plan.load.users[0], result.run, nothing, repeat)
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


TASK = TaskSpec(kind="capacity", plan=CapacityPlan, new=new_capacity,
                check=lambda plan, config, session: session and session_engines(session, plan.engines),  # loaded?
                run=lambda session, plan, result, notify: run_capacity(session, plan, result, notify, on_step=notify),
                write=write_capacity, engines=lambda plan, config: plan.engines,
                started=lambda result: f"Capacity search ({result.id}) started.", write_live=True, starts_session=True)
