"""The engine host behind the dashboard: one event loop thread, one session, one run at a time.

Engines are bound to the event loop they were started on (vLLM's output handler, the HF worker's
call-backs), so the host keeps a single loop alive in a thread and submits everything to it. Browsers
only read snapshots: the load status, the current (or last) RunResult, and a version number that
changes whenever there is something new to draw.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from lab.config import EngineConfig, RunPlan
from lab.environment import process_rss_bytes, read_device, versions
from lab.memory import kv_fit_warning
from lab.runs import RUNNING, RunResult
from lab.session import LabSession, SessionCheck, check_session
from lab.status import RunStatus
from lab.store import save_experiment, save_run, save_sweep

log = logging.getLogger(__name__)


@dataclass
class LoadStatus:
    """What is loading and how far it got."""

    steps: list[str] = field(default_factory=list)
    total_steps: int = 0
    ready: bool = False
    error: str = ""
    started_s: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        """One line for the page (while loading it changes every second: the elapsed time)."""
        if self.error:
            return f"Loading failed: {self.error}"
        if self.ready:
            return "Engines ready."
        done = max(0, len(self.steps) - 1)
        current = self.steps[-1] if self.steps else "starting"
        elapsed = time.monotonic() - self.started_s
        return f"Loading ({done}/{self.total_steps} steps done, {elapsed:.0f} s so far): {current}"


def _poll_until(done, timeout_s: float | None, every_s: float = 0.2) -> bool:
    """Wait until done() is true or timeout_s passes; returns done()."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


class _Recorder:
    """Observer that bumps the host's version and stores the run as each level and the run end."""

    def __init__(self, host: LabHost):
        self.host = host
        self.saved_levels = 0

    def on_start(self, result: RunResult) -> None:
        self.host.bump()

    def on_update(self, result: RunResult) -> None:
        finished = sum(1 for lvl in result.levels if lvl.status != RUNNING)
        if finished != self.saved_levels:
            self.saved_levels = finished
            self.host.save(result)
        self.host.bump()

    def on_complete(self, result: RunResult) -> None:
        self.host.save(result)
        self.host.bump()


class LabHost:
    """Holds the loaded engines for the app; thread-safe entry points for UI callbacks."""

    def __init__(self, config: EngineConfig, engines: tuple[str, ...] = ("hf", "vllm"),
                 db_path: str | Path | None = None):
        from lab.store import default_db_path

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
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lab-host", daemon=True)
        self._thread.start()

    # -- loading ------------------------------------------------------------------------------
    def start_loading(self) -> Future:
        """Start the engines in the background; progress goes to ``status``."""
        return asyncio.run_coroutine_threadsafe(self._load(), self._loop)

    async def _load(self) -> None:
        def say(text: str) -> None:
            self.status.steps.append(text)
            self.bump()

        try:
            session = LabSession(self.config, self.engine_names, self.check)
            await session.start(say)
            self.session = session
            self.status.ready = True
        except Exception as exc:
            log.exception("loading failed")
            self.status.error = f"{type(exc).__name__}: {exc}"
        self.bump()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until the engines are loaded (or failed); True when ready."""
        _poll_until(lambda: self.status.ready or bool(self.status.error), timeout_s)
        return self.status.ready

    # -- runs ---------------------------------------------------------------------------------
    def running(self) -> bool:
        """Whether a run is in progress."""
        return self._task is not None and not self._task.done()

    def busy(self) -> str | None:
        """Why nothing can start now (loading, or a run or experiment in progress), else None."""
        if not self.status.ready:
            return self.status.text()
        if self.running():
            return "A run, experiment or sweep is already in progress: watching it live."
        return None

    def submit(self, plan: RunPlan) -> tuple[bool, str]:
        """Start a run unless something is going; returns (started, message)."""
        with self._lock:
            reason = self.busy()
            if reason:
                return False, reason
            result = self.session.new_result(plan)
            self.result = result
            self._start(self.session.run(plan, [_Recorder(self)], result))
        self.bump()
        warning = kv_fit_warning(plan, self.check.memory)
        return True, f"Run {result.run_id} started." + (f" **Warning:** {warning}." if warning else "")

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
            result = new_result(self.session, name, params)
            self.experiment = result
            self._start(self._experiment(name, params, result, run_experiment))
        self.bump()
        return True, f"Experiment {name} ({result.experiment_id}) started."

    async def _experiment(self, name: str, params, result, run_experiment) -> None:
        await run_experiment(self.session, name, params, result, lambda r: self.bump())
        self.save(result, save_experiment)
        self.bump()

    def submit_sweep(self, plan) -> tuple[bool, str]:
        """Start a sweep unless something is going; stored as each value ends (partial ones too).

        Raises:
            ValueError: a knob or value the engine does not allow (before anything restarts).
        """
        from lab.sweeps import new_sweep

        plan.check(self.config, self.session.held_bytes(plan.engine) if self.session else 0)
        with self._lock:
            reason = self.busy()
            if reason:
                return False, reason
            result = new_sweep(self.session, plan)
            self.sweep = result
            self._start(self._sweep(plan, result))
        self.bump()
        return True, f"Sweep of {plan.knob} ({result.sweep_id}) started: one {plan.engine} restart per value."

    async def _sweep(self, plan, result) -> None:
        from lab.sweeps import run_sweep

        def stored(r) -> None:
            self.save(r, save_sweep)
            self.bump()

        await run_sweep(self.session, plan, result, stored)

    def _start(self, coro) -> None:
        """Run ``coro`` as the one task on the host's loop."""
        async def start() -> None:
            self._task = asyncio.ensure_future(coro)

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10)

    def cancel(self) -> str:
        """Cancel the run in progress (it stops within about two seconds and keeps its data)."""
        if not self.running():
            return "No run in progress."
        self._loop.call_soon_threadsafe(self._task.cancel)
        if self.sweep is not None and self.sweep.status == RunStatus.RUNNING:
            return ("Cancelling the sweep: it stops once the engine restart in progress (if any) has finished, "
                    "keeps its finished values and restores the session's setting.")
        return "Cancelling: the run stops within about two seconds and keeps what it measured."

    def wait_run(self, timeout_s: float | None = None) -> RunResult | None:
        """Block until the current run ends (or the timeout passes); returns it."""
        _poll_until(lambda: not self.running(), timeout_s)
        return self.result

    # -- snapshots ----------------------------------------------------------------------------
    def bump(self) -> None:
        """Tell watchers there is something new to draw."""
        self.version += 1

    def save(self, result, store=save_run) -> None:
        """Store a run, experiment or sweep (partial or final) in the results database; a failure is logged."""
        try:
            store(self.db_path, result)
        except Exception:
            log.exception("could not store %s", type(result).__name__)

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
            "process_rss_bytes": process_rss_bytes(),
            "load_status": self.status.text(),
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
        if self.session is not None:
            asyncio.run_coroutine_threadsafe(self.session.stop(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
