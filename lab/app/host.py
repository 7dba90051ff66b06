"""The engine host behind the page: one session, one task at a time, implementing the ``Host`` seam.

LabHost loads the engines, starts runs, experiments and sweeps as the one task of its TaskRunner (runner.py),
restarts dead engines through its EngineDoctor (health.py), connects endpoints and stores every task as it
goes. Pages only read snapshots: the load status, the current (or last) results, and a version number that
changes whenever there is something new to draw.
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
from lab.engines.registry import label
from lab.environment import process_rss_bytes, read_device, shm_warning, versions
from lab.estimate import Estimate, estimate_run, stored_history
from lab.memory import kv_fit_warning
from lab.predictions import RATIO, STEP, TASKS, Round, new_round
from lab.runs import RunResult, wall_s
from lab.session import LabSession, SessionCheck, check_session, settle_heap
from lab.status import RunStatus
from lab.store import default_db_path, save

log = logging.getLogger(__name__)
__all__ = ["MAX_DEATHS", "LabHost", "LoadStatus"]


class _Recorder:
    """Observer that bumps the host's version and stores the run as each level and the run end."""

    def __init__(self, host: LabHost):
        self.host = host
        self.saved_levels = 0

    def on_start(self, result: RunResult) -> None:
        self.host.bump()

    def on_update(self, result: RunResult) -> None:
        finished = sum(1 for lvl in result.levels if lvl.status != RunStatus.RUNNING)
        if finished != self.saved_levels:
            self.saved_levels = finished
            self.host.keep(result)
        self.host.bump()

    def on_complete(self, result: RunResult) -> None:
        self.host.keep(result)
        log_estimate(result)
        if result.status == RunStatus.OK:  # a good run ends a streak of deaths
            self.host.doctor.recovered(result.plan.engines)
        self.host.bump()


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

    def __init__(self, config: EngineConfig, engines: tuple[str, ...] = ("hf", "vllm"),
                 db_path: str | Path | None = None):
        self.config = config
        self.engine_names = engines
        self.db_path = Path(db_path) if db_path else default_db_path()
        self.check: SessionCheck = check_session(config, engines)  # bad config fails here, before loading
        self.status = LoadStatus(total_steps=1 + len(engines) + (len(engines) > 1))  # + agreement check
        self.session: LabSession | None = None
        self.result: RunResult | None = None
        self.experiment = None  # the current (or last) ExperimentResult
        self.sweep = None  # the current (or last) SweepResult
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
        """Whether a run, experiment or sweep is in progress."""
        return self.runner.running()

    def busy(self) -> str | None:
        """Why nothing can start now (loading, or a run or experiment in progress), else None."""
        if not self.status.ready:
            return self.status.text()
        if self.running():
            return "A run, experiment or sweep is already in progress: watching it live."
        return None

    def submit(self, plan: RunPlan) -> tuple[bool, str]:
        """Start a run unless something is going (a dead engine of the plan is restarted first, unless it
        died too often); returns (started, message)."""
        with self._lock:
            reason, dead_now = self.busy(), self.dead()
            dead = [name for name in plan.engines if name in dead_now]
            reason = reason or self.doctor.refuse(dead)
            if reason:
                return False, reason
            result = self.result = self.session.new_result(plan)
            result.estimate_s = self.estimate(plan, dead).seconds
            self._attach(result.id, RATIO)
            self.runner.start(self._restart_then_run(dead, plan, result))
        self.bump()
        warning = kv_fit_warning(plan, self.check.memory)
        restart = f" First restarting {names(dead)}." if dead else ""
        return True, f"Run {result.id} started.{restart}" + (f" **Warning:** {warning}." if warning else "")

    def estimate(self, plan: RunPlan, dead: list[str]) -> Estimate:
        """How long ``plan`` should take here (lab.estimate), restarting the ``dead`` engines first."""
        session = self.session
        past = stored_history(self.db_path, self.check.model, self.check.memory.device.name,
                              session.probes if session else None)
        health = self.health()
        return estimate_run(plan, past, {name: health[name].get("last_start_s") or 0.0 for name in dead})

    async def _restart_then_run(self, dead: list[str], plan: RunPlan, result: RunResult) -> None:
        if dead:
            result.message = f"restarting {names(dead)} first ({self.doctor.start_words(dead)})"
        if dead and not await self.doctor.restart(dead):
            result.status, result.error = RunStatus.FAILED, "; ".join(self.doctor.errors.values())
            result.message = f"failed: could not restart {names(dead)}: {result.error}"
            self.keep(result)
            return
        result.engine_info = {name: self.session.info[name] for name in plan.engines}
        await self.session.run(plan, [_Recorder(self)], result)

    def submit_experiment(self, name: str, params) -> tuple[bool, str]:
        """Start a KV-cache experiment unless something is going; stored as it ends (partial ones too).

        Raises:
            ValueError: a parameter past its limit (before anything starts).
        """
        from lab.experiments import new_result, run_experiment, validate

        validate(name, params, self.config)
        with self._lock:
            reason = self.busy()
            if reason:
                return False, reason
            result = self.experiment = new_result(self.session, name, params)
            if name == "why":
                self._attach(result.id, STEP)
            self.runner.start(run_experiment(self.session, name, params, result, self._ended))
        self.bump()
        return True, f"Experiment {name} ({result.id}) started."

    def submit_sweep(self, plan) -> tuple[bool, str]:
        """Start a sweep unless something is going; stored as each value ends (partial ones too).

        Raises:
            ValueError: a knob or value the engine does not allow (before anything restarts).
        """
        from lab.sweeps import new_sweep, run_sweep

        plan.check(self.config, self.session.held_bytes(plan.engine) if self.session else 0)
        with self._lock:
            reason = self.busy()
            if reason:
                return False, reason
            result = self.sweep = new_sweep(self.session, plan)
            self.runner.start(run_sweep(self.session, plan, result, self._ended))
        self.bump()
        return True, f"Sweep of {plan.knob} ({result.id}) started: one {names([plan.engine])} restart per value."

    def _ended(self, result) -> None:
        """An experiment's or a sweep's update: stored once it has ended, or at every update where its kind says so."""
        if result.status != RunStatus.RUNNING or result.STORED_AS_IT_GOES:
            self.keep(result)
        self.bump()

    def cancel(self) -> str:
        """Cancel the task in progress (it stops within about two seconds and keeps its data)."""
        if not self.running():
            return "No run in progress."
        self.runner.cancel()
        if self.sweep is not None and self.sweep.status == RunStatus.RUNNING:
            return ("Cancelling the sweep: it stops once the engine restart in progress (if any) has finished, "
                    "keeps its finished values and restores the session's setting.")
        return "Cancelling: the run stops within about two seconds and keeps what it measured."

    def wait_run(self, timeout_s: float | None = None) -> RunResult | None:
        """Block until the current task ends (or the timeout passes); returns the current run."""
        self.runner.wait(timeout_s)
        return self.result

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
            reason = self.busy() or ("" if dead else "Every engine is alive: nothing to restart.")
            reason = reason or self.doctor.refuse(dead)
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
        """Store a run, experiment or sweep (partial or final) in the results database; a failure is logged."""
        try:
            save(self.db_path, result, self._predictions_of(result))
        except Exception:
            log.exception("could not store %s %s", result.KIND, result.id)

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
            self.wait_run(10)
        began = time.monotonic()
        if self.session is not None:
            self.runner.submit(self.session.stop()).result(timeout=60)
        self.runner.stop()
        log.info("engines stopped in %.1f s", time.monotonic() - began)
