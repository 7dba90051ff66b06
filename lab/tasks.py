"""The one seam every task kind goes through: a result base, ``supervise``, and the table of kinds.

A run, an experiment (the Why ladder is one), a sweep and a capacity search each fill a ``TaskResult`` subclass as
they go. Their work runs under ``supervise``, which alone decides how a task ended (ok, cancelled, failed), says so
in the result's message with what its kind keeps, stamps the end, and hands the ended result to the caller's
``on_end`` once (the app stores it, the CLI writes its files). A task never loses what it measured: the classification
only labels it. ``KINDS`` names each kind's module; its ``TASK`` (a TaskSpec) says how to check a request before
anything loads, make its result, run it and write it: the page's host and the CLI's runner read only that.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from lab.engines.base import EngineFault
from lab.status import RunStatus

log = logging.getLogger(__name__)


def now_text() -> str:
    """UTC now, to the second, as results store it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(kw_only=True)
class TaskResult:
    """What every task kind holds: who it is, how it went, and where it ran.

    Attributes:
        id: 12 hex digits, unique per task (stored under KIND_id: run_id, experiment_id, sweep_id).
        model, device, versions: The session it ran on.
        engine_args: Each engine's arguments as it ran.
        started_at, ended_at: UTC, to the second (ended_at None while it goes).
        status, error, message: How it is going or ended, why it failed, and one line for the page.
    """

    KIND: ClassVar[str] = "task"
    KEPT: ClassVar[str] = "what was measured is kept"  # said when it stops early
    STORED_AS_IT_GOES: ClassVar[bool] = False  # the app stores it at every update, not only once it has ended

    model: str = ""
    device: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    engine_args: dict = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: str = field(default_factory=now_text)
    ended_at: str | None = None
    status: RunStatus = RunStatus.RUNNING
    error: str = ""
    message: str = "starting"

    def name(self) -> str:
        """Which one of its kind (an experiment's name, a sweep's knob, a run's workload)."""
        return self.KIND

    def checkpoint(self) -> object:
        """What, when it differs from what it was at the last store, makes the app store the result again: its
        end, or every update where its kind says so (None: nothing to store yet)."""
        if self.STORED_AS_IT_GOES:
            return object()
        return None if self.status == RunStatus.RUNNING else self.status


async def supervise(result: TaskResult, work: Awaitable, on_end: Callable[[TaskResult], None] | None = None,
                    salvage: Callable[[], None] | None = None) -> TaskResult:
    """Await ``work`` (which fills ``result``), then classify how it ended and hand the result to ``on_end``.

    Args:
        result: The task's result, filled by ``work`` as it goes.
        work: The task's coroutine.
        on_end: Called once with the ended result (store it, write its files); its failure is logged.
        salvage: Called after a cancel or a failure, to compute what the measured part allows.

    Returns:
        ``result``: ok; cancelled (a cancel reached ``work``); or failed (``error`` says why).
    """
    try:
        await work
        result.status, result.message = RunStatus.OK, "done"
    except asyncio.CancelledError:
        result.status, result.message = RunStatus.CANCELLED, f"cancelled: {result.KEPT}"
    except EngineFault as exc:  # an engine died or failed its work: its words say enough
        log.warning("%s %s failed: %s", result.KIND, result.id, exc)
        _failed(result, str(exc))
    except Exception as exc:
        log.exception("%s %s failed", result.KIND, result.id)
        _failed(result, f"{type(exc).__name__}: {exc}")
    if result.status != RunStatus.OK and salvage is not None:
        salvage()
    result.ended_at = now_text()
    if on_end is not None:
        _hand_over(on_end, result)
    return result


def _failed(result: TaskResult, error: str) -> None:
    result.status, result.error = RunStatus.FAILED, error
    result.message = f"failed: {error} ({result.KEPT})"


def _hand_over(on_end: Callable, result: TaskResult) -> None:
    try:
        on_end(result)
    except Exception:
        log.exception("could not keep %s %s", result.KIND, result.id)


def nothing(*_) -> None:
    """A check, warning or notify that has nothing to do."""


@dataclass(frozen=True)
class TaskSpec:
    """How one task kind goes, whoever starts it (the page's host, the CLI's runner): the one table of kinds.

    Attributes:
        kind: The kind's name (run, experiment, sweep, capacity), as the history stores it.
        plan: The type of its request (RunPlan, ExperimentPlan, SweepPlan, CapacityPlan): a request names its kind.
        check: ``check(plan, config, session)``: every rule, before anything loads or restarts (ValueError).
        new: ``new(session, plan)``: its empty result, stamped with the session.
        run: ``run(session, plan, result, notify)``: fills the result under ``supervise``; ``notify(result)``
            is the one progress channel, called whenever it changed and once it ended.
        write: ``write(result, out_dir)``: its files, by name.
        engines: ``engines(plan, config)``: the engines the CLI's session loads for it (``run_jobs`` loads those its
            jobs name; the page's session holds its own).
        started: ``started(result)``: the page's line once it started.
        cancelling: The page's line as a cancel reaches it.
        restarts_dead: A dead engine of its plan is restarted first, instead of refusing it.
        warning, write_live, starts_session, predicts: See below.
    """

    kind: str
    plan: type
    check: Callable
    new: Callable
    run: Callable
    write: Callable
    engines: Callable
    started: Callable
    warning: Callable = nothing  # ``warning(plan, memory_plan)``: a word of caution as it starts, or None
    cancelling: str = "Cancelling: the run stops within about two seconds and keeps what it measured."
    restarts_dead: bool = False
    write_live: bool = False  # the CLI rewrites its files at every update (a task killed from outside keeps them)
    starts_session: bool = False  # its run starts the session's engines itself (a capacity search: in its time)
    predicts: Callable = nothing  # ``predicts(plan)``: the kind of the room's predictions round it takes as it starts
    #                               (lab.predictions.TASKS: a load test's ratio, the Why ladder's step), or None


KINDS = {"run": "lab.runs", "experiment": "lab.experiments", "sweep": "lab.sweeps", "capacity": "lab.capacity"}
# each module's TASK (a TaskSpec), found by name as the engine registry finds its factories: no import cycle


def spec(kind: str) -> TaskSpec:
    """The TaskSpec of ``kind`` (ValueError for a kind the table does not hold)."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; choose one of {', '.join(KINDS)}")
    return importlib.import_module(KINDS[kind]).TASK


def spec_of(plan) -> TaskSpec:
    """The TaskSpec whose request ``plan`` is (ValueError for a request of no kind)."""
    found = next((s for s in map(spec, KINDS) if isinstance(plan, s.plan)), None)
    if found is None:
        raise ValueError(f"no task kind takes a {type(plan).__name__}")
    return found
