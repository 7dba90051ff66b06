"""The engine host behind the page: one session, one task at a time, implementing the ``Host`` seam.

LabHost loads the engines, starts every task kind through one ``submit`` (the request names its kind: lab.tasks) as
the one task of its TaskRunner (runner.py), restarts dead engines through its EngineDoctor (health.py), connects
endpoints and stores every task at its checkpoints. Pages only read snapshots: the load status, the current task
and the last of each kind, and a version number that changes whenever there is something new to draw.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from lab.app.health import MAX_DEATHS, EngineDoctor
from lab.app.runner import TaskRunner, poll_until
from lab.app.seam import LoadStatus
from lab.config import Endpoint, EngineConfig, RunPlan
from lab.engines.registry import default_names, label
from lab.environment import process_rss_bytes, read_device, shm_warning, versions
from lab.estimate import Estimate, estimate_run, stored_history
from lab.predictions import TASKS, Round, new_round
from lab.runs import RunResult, wall_s
from lab.session import LabSession, SessionCheck, check_session, settle_heap
from lab.status import RunStatus
from lab.store import default_db_path, keep, save_at_checkpoint
from lab.tasks import spec, spec_of

log = logging.getLogger(__name__)
__all__ = ["MAX_DEATHS", "LabHost", "LoadStatus"]
BUSY = "A run, experiment, sweep or capacity search is already in progress: watching it live."
RESTART_CANCELLING = "Cancelling the restart: the engine starting now finishes its start; those not begun stay dead."
NOTHING_TO_CANCEL = "No run in progress."


def names(engines) -> str:
    """Engines as the page names them (vLLM, HF; an endpoint by its own name)."""
    return ", ".join(map(label, engines))


def log_estimate(result: RunResult) -> None:
    """Log how far the run's estimate was from its measured time (summary.json keeps both)."""
    took = wall_s(result)
    if result.estimate_s and took:
        log.info("run %s took %.1f s, estimated %.1f s: error %+.0f%%", result.id, took, result.estimate_s,
                 100 * (result.estimate_s - took) / took)


class LabHost:
    """Holds the loaded engines for the app; thread-safe entry points for UI callbacks."""

    def __init__(self, config: EngineConfig, engines: tuple[str, ...] = default_names(),
                 db_path: str | Path | None = None):
        self.config = config
        self.engine_names = engines
        self.db_path = Path(db_path) if db_path else default_db_path()
        self.check: SessionCheck = check_session(config, engines)  # bad config fails here, before loading
        self.status = LoadStatus(total_steps=1 + len(engines) + (len(engines) > 1))  # + agreement check
        self.session: LabSession | None = None
        self.task = None  # the current (or last) task of any kind
        self.tasks: dict = {}  # the current (or last) task of each kind (lab.tasks.KINDS)
        self._stored = None  # the current task's checkpoint when it was last stored
        self.version = 0
        self.doctor = EngineDoctor(self)
        self.runner = TaskRunner(self.bump)  # a task's end bumps the version: its last words change the page
        self._lock = threading.Lock()
        self.round: Round | None = None  # the room's predictions the pages show (lab.predictions)
        self._predicted: Round | None = None  # the round attached to the task now going or last ended
        self._round_lock = threading.Lock()  # its own: a prediction never waits for a submit's checks

    # -- loading ------------------------------------------------------------------------------
    def start_loading(self) -> Future:
        """Start the engines in the background; progress goes to ``status``."""
        return self.runner.submit(self._load())

    async def _load(self) -> None:
        def say(text: str) -> None:
            self.status.steps.append(text)
            self.bump()

        try:
            session = LabSession(self.config, self.engine_names, self.check)
            await session.start(say)
            await session.probe_engines()  # the estimate's first guess, priced on this machine (lab.estimate)
            settle_heap()
            self.session = session
            self.status.ready = True
            log.info("engines ready: %s", ", ".join(self.engine_names))
        except Exception as exc:
            log.exception("loading failed")
            self.status.error = f"{type(exc).__name__}: {exc}"
        self.bump()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until the engines are loaded (or failed); True when ready."""
        poll_until(lambda: self.status.ready or bool(self.status.error), timeout_s)
        return self.status.ready

    # -- tasks --------------------------------------------------------------------------------
    def running(self) -> bool:
        """Whether a task (a run, experiment, sweep or search; a restart) is in progress."""
        return self.runner.running()

    def busy(self, dead: list[str] = ()) -> str | None:
        """The one busy rule: why nothing can start now (loading, a task in progress, ``dead`` engines that died too
        often to restart), else None."""
        if not self.status.ready:
            return self.status.text()
        if self.running():
            return BUSY
        return self.doctor.refuse(dead) if dead else None

    def last(self, kind: str):
        """The current (or last) task of ``kind`` (run, experiment, sweep, capacity), None before the first."""
        return self.tasks.get(kind)

    def submit(self, plan) -> tuple[bool, str]:
        """Start the task ``plan`` asks for unless something is going: (started, message). The kind's dead engines
        are restarted first where its kind says so (unless they died too often).

        Raises:
            ValueError: a request its kind refuses (before anything starts or restarts).
        """
        task = spec_of(plan)
        task.check(plan, self.config, self.session)
        with self._lock:
            dead = [name for name in getattr(plan, "engines", ()) if name in self.dead()] if task.restarts_dead else []
            reason = self.busy(dead)
            if reason:
                return False, reason
            result = self.task = self.tasks[task.kind] = task.new(self.session, plan)
            self._stored = result.checkpoint()
            self._prepare(task, plan, result, dead)
            self.runner.start(self._go(task, plan, result, dead))
        self.bump()
        return True, self._started_words(task, plan, result, dead)

    def _prepare(self, task, plan, result, dead: list[str]) -> None:
        """A run's estimate; the room's predictions round its kind takes (TaskSpec.predicts) goes with it."""
        if isinstance(result, RunResult):
            result.estimate_s = self.estimate(plan, dead).seconds
        kind = task.predicts(plan)
        if kind:
            self._attach(result.id, kind)

    def _started_words(self, task, plan, result, dead: list[str]) -> str:
        warning = task.warning(plan, self.check.memory)
        restart = f" First restarting {names(dead)}." if dead else ""
        return task.started(result) + restart + (f" **Warning:** {warning}." if warning else "")

    def estimate(self, plan: RunPlan, dead: list[str]) -> Estimate:
        """How long ``plan`` should take here (lab.estimate), restarting the ``dead`` engines first."""
        session = self.session
        past = stored_history(self.db_path, self.check.model, self.check.memory.device.name,
                              session.probes if session else None)
        health = self.health()
        return estimate_run(plan, past, {name: health[name].get("last_start_s") or 0.0 for name in dead})

    async def _go(self, task, plan, result, dead: list[str]) -> None:
        if dead:
            result.message = f"restarting {names(dead)} first ({self.doctor.start_words(dead)})"
        if dead and not await self.doctor.restart(dead):
            result.status, result.error = RunStatus.FAILED, "; ".join(self.doctor.errors.values())
            result.message = f"failed: could not restart {names(dead)}: {result.error}"
            self.keep(result)
            return
        await task.run(self.session, plan, result, self._progress)

    def _progress(self, result) -> None:
        """Every task's one progress channel: stored at each of its checkpoints; an ended run logs its estimate's
        error and ends a streak of deaths; watchers told."""
        self._stored = save_at_checkpoint(result, self._stored, self.keep)
        if isinstance(result, RunResult) and result.ended_at:
            log_estimate(result)
            if result.status == RunStatus.OK:  # a good run ends a streak of deaths
                self.doctor.recovered(result.plan.engines)
        self.bump()

    def cancel(self) -> str:
        """Cancel the task in progress (it stops within about two seconds and keeps its data), or a restart of dead
        engines; the words of what is cancelled."""
        if not self.running():
            return NOTHING_TO_CANCEL
        self.runner.cancel()
        going = self.task is not None and self.task.status == RunStatus.RUNNING
        return spec(self.task.KIND).cancelling if going else RESTART_CANCELLING

    def wait_task(self, timeout_s: float | None = None):
        """Block until the current task ends (or the timeout passes); returns it (None before the first)."""
        self.runner.wait(timeout_s)
        return self.task

    # -- engine health ------------------------------------------------------------------------
    def health(self) -> dict[str, dict]:
        """Each engine: state (loading, alive, dead, restarting), why it is dead, and its last start in s."""
        return self.doctor.health()

    def dead(self) -> list[str]:
        """The engines that died (and are not being restarted)."""
        return self.doctor.dead()

    def status_text(self) -> str:
        """The header line: loading progress, or each engine's health once loaded."""
        return self.doctor.status_text()

    def restart_dead(self) -> tuple[bool, str]:
        """Restart the engines that died (the others stay loaded), unless something is going."""
        with self._lock:
            dead = self.dead()
            reason = self.busy(dead) or ("" if dead else "Every engine is alive: nothing to restart.")
            if reason:
                return False, reason
            self.runner.start(self.doctor.restart(dead))
        self.bump()
        return True, f"Restarting {names(dead)}: {self.doctor.start_words(dead)}."

    # -- the room's predictions ----------------------------------------------------------------
    # (no bump: every sync carries the round, and a room's burst of answers must not redraw the run's figures)
    def open_predictions(self, kind: str) -> tuple[bool, str]:
        """Open predictions for the next load test ('ratio') or Why ladder ('step'): the open round of that kind
        again (its answers kept) or a new one."""
        with self._round_lock:
            current = self.round
            if current is not None and current.task_id is None and current.kind == kind:
                current.open = True
            else:
                try:
                    self.round = new_round(kind, self.check.device)
                except ValueError as exc:
                    return False, str(exc)
        return True, f"Predictions open for the next {TASKS[kind]}: they close as it starts."

    def close_predictions(self) -> str:
        """Stop taking predictions; those made go with the next task of their kind."""
        with self._round_lock:
            if self.round is None or not self.round.open:
                return "No predictions are open."
            self.round.open = False
        return f"Predictions closed: {len(self.round.answers)} made, kept for the next {TASKS[self.round.kind]}."

    def predict(self, page: str, answer) -> tuple[bool, str]:
        """Keep ``page``'s answer in the open round (replacing its last)."""
        with self._round_lock:
            if self.round is None:
                return False, "No predictions are open: the presenter opens them before a run."
            try:
                words = self.round.answer(page, answer)
            except ValueError as exc:
                return False, str(exc)
        return True, words

    def predictions(self) -> dict | None:
        """The round the pages show (lab.predictions.Round.view), None before any."""
        with self._round_lock:
            return None if self.round is None else self.round.view()

    def _attach(self, task_id: str, kind: str) -> None:
        """A task of ``kind`` starts: the round of that kind waiting for one closes and goes with it."""
        with self._round_lock:
            if self.round is not None and self.round.task_id is None and self.round.kind == kind:
                self.round.attach(task_id)
                self._predicted = self.round

    def _predictions_of(self, result) -> dict | None:
        """The ``predictions`` stored with ``result`` (its measured answer taken once it has ended), or None."""
        found = self._predicted
        if found is None or found.task_id != result.id:
            return None
        if result.status != RunStatus.RUNNING and not found.ended:
            found.measure(result.to_dict())
        return {"predictions": found.stored()}

    # -- endpoints ----------------------------------------------------------------------------
    def connect_endpoint(self, endpoint: Endpoint) -> tuple[bool, str]:
        """Check a server and add it as an engine beside the loaded ones (an endpoint of the same name is
        replaced); returns (connected, message)."""
        from lab.engines.openai import probe

        with self._lock:
            reason = self.busy()
            if reason:
                return False, reason
            try:
                probe(endpoint)
            except ValueError as exc:
                return False, str(exc)
            kept = tuple(e for e in self.config.endpoints if e.name != endpoint.name)
            config = self.config.with_overrides(endpoints=kept + (endpoint,))
            future = self.runner.submit(self.session.restart_engine(endpoint.name, config))
            try:
                info = future.result()  # its start has its own time limits (a 10 s connect, the probe)
            except Exception as exc:  # noqa: BLE001 - a server that answers the probe but not a request
                self.engine_names = tuple(n for n in self.engine_names if n in self.session.engines
                                          or self.config.endpoint(n) is None)
                return False, f"{endpoint.name}: {type(exc).__name__}: {exc}"
            self.config = self.session.config = config
            self.engine_names += () if endpoint.name in self.engine_names else (endpoint.name,)
        self.bump()
        args = info.args
        return True, (f"Connected **{endpoint.name}**: {args['served_model']} at {endpoint.base_url} "
                      f"({args['dialect']} prompts, {'with' if args['metrics'] else 'no'} /metrics).")

    # -- snapshots ----------------------------------------------------------------------------
    def on_loop(self, fn, timeout_s: float | None = None):
        """``fn()`` called on the host's event loop (TaskRunner.on_loop)."""
        return self.runner.on_loop(fn, timeout_s)

    def bump(self) -> None:
        """Tell watchers there is something new to draw."""
        self.version += 1

    def keep(self, result) -> None:
        """Store any task (partial or final) in the results database, with its predictions; a failure is logged."""
        keep(self.db_path, result, self._predictions_of(result))

    def environment(self) -> dict:
        """Device, versions, model and both engines' args and memory, as shown on the Environment tab."""
        info = self.session.info if self.session else {}
        device = read_device(self.check.device)
        return {
            "device": device.to_dict(),
            "versions": versions(),
            "model": {"name": self.check.model, "location": self.check.model_path,
                      "weights_bytes": self.check.memory.weights_bytes},
            "memory_plan": self.check.memory.to_dict(),
            "engines": {name: {"args": i.args, "attention": i.attention, "kv_total_blocks": i.kv_total_blocks,
                               "kv_block_size": i.kv_block_size, "kv_bytes_per_token": i.kv_bytes_per_token,
                               "memory_bytes": i.memory_bytes} for name, i in info.items()},
            "agreement": self.agreement(),
            "health": self.health(),
            "process_rss_bytes": process_rss_bytes(),
            "load_status": self.status_text(),
            "shm_warning": shm_warning(),
        }

    def agreement(self) -> dict | None:
        """The start-up agreement check: ok (None when skipped), one verdict per pair, the pairs."""
        report = self.session.agreement if self.session else None
        if report is None:
            return None
        return {"ok": report.ok, "verdicts": report.verdicts(), "pairs": report.to_dict()}

    def close(self) -> None:
        """Stop the engines and the loop thread."""
        if self.running():
            self.cancel()
            self.wait_task(10)
        began = time.monotonic()
        if self.session is not None:
            self.runner.submit(self.session.stop()).result(timeout=60)
        self.runner.stop()
        log.info("engines stopped in %.1f s", time.monotonic() - began)
