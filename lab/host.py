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

from lab.config import Endpoint, EngineConfig, RunPlan
from lab.environment import process_rss_bytes, read_device, versions
from lab.memory import kv_fit_warning
from lab.runs import RUNNING, RunResult
from lab.session import LabSession, SessionCheck, check_session, new_loop, settle_heap
from lab.status import EngineHealth, RunStatus
from lab.store import save_experiment, save_run, save_sweep

log = logging.getLogger(__name__)
MAX_DEATHS = 3  # restarts of one engine in a row (no good run between) before the lab stops restarting it


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
        if result.status == RunStatus.OK:  # a good run ends a streak of deaths
            for name in result.plan.engines:
                self.host.deaths.pop(name, None)
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
        self.deaths: dict[str, int] = {}  # restarts after a death, per engine, since its last good run
        self.restarting: set[str] = set()
        self.restart_errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None
        self._loop = new_loop()
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
        """Start a run unless something is going (a dead engine of the plan is restarted first, unless it
        died too often); returns (started, message)."""
        with self._lock:
            reason, dead_now = self.busy(), self.dead()
            dead = [name for name in plan.engines if name in dead_now]
            reason = reason or self.refuse_restart(dead)
            if reason:
                return False, reason
            result = self.session.new_result(plan)
            self.result = result
            self._start(self._restart_then_run(dead, plan, result))
        self.bump()
        warning = kv_fit_warning(plan, self.check.memory)
        restart = f" First restarting {', '.join(dead)}." if dead else ""
        return True, f"Run {result.run_id} started.{restart}" + (f" **Warning:** {warning}." if warning else "")

    async def _restart_then_run(self, dead: list[str], plan: RunPlan, result: RunResult) -> None:
        if dead:
            result.message = f"restarting {', '.join(dead)} first ({self.start_words(dead)})"
        if dead and not await self._restart(dead):
            result.status, result.error = RunStatus.FAILED, "; ".join(self.restart_errors.values())
            result.message = f"failed: could not restart {', '.join(dead)}: {result.error}"
            self.save(result)
            return
        result.engine_info = {name: self.session.info[name] for name in plan.engines}
        await self.session.run(plan, [_Recorder(self)], result)

    # -- engine health ------------------------------------------------------------------------
    def health(self) -> dict[str, dict]:
        """Each engine: state (loading, alive, dead, restarting), why it is dead, and its last start in s."""
        engines = self.session.engines if self.session else {}
        starts = self.session.start_s if self.session else {}
        out = {}
        for name in self.engine_names:
            engine, reason = engines.get(name), self.restart_errors.get(name, "")
            if name in self.restarting:
                state = EngineHealth.RESTARTING
            elif engine is None:
                state = EngineHealth.DEAD if (self.status.error or reason) else EngineHealth.LOADING
                reason = reason or self.status.error
            else:
                state = EngineHealth.ALIVE if engine.alive() else EngineHealth.DEAD
                reason = "" if state == EngineHealth.ALIVE else engine.fault() or "stopped"
            out[name] = {"state": state, "reason": reason, "last_start_s": starts.get(name)}
        return out

    def dead(self, health: dict[str, dict] | None = None) -> list[str]:
        """The engines that died (and are not being restarted); ``health`` when it was just read."""
        if self.session is None:  # nothing loaded (or loading failed): nothing to restart
            return []
        return [name for name, h in (health or self.health()).items() if h["state"] == EngineHealth.DEAD]

    def refuse_restart(self, names: list[str]) -> str | None:
        """Why the lab will not restart these engines again (each died MAX_DEATHS times in a row), else None."""
        worn = [name for name in names if self.deaths.get(name, 0) >= MAX_DEATHS]
        if not worn:
            return None
        return (f"{', '.join(worn)} died {MAX_DEATHS} times in a row, each time after a restart: the lab stops "
                f"restarting it. Read the app's log for the cause, then restart the app.")

    def restart_dead(self) -> tuple[bool, str]:
        """Restart the engines that died (the others stay loaded), unless something is going."""
        with self._lock:
            dead = self.dead()
            reason = self.busy() or ("" if dead else "Every engine is alive: nothing to restart.")
            reason = reason or self.refuse_restart(dead)
            if reason:
                return False, reason
            self._start(self._restart(dead))
        self.bump()
        return True, f"Restarting {', '.join(dead)}: {self.start_words(dead)}."

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
            future = asyncio.run_coroutine_threadsafe(self.session.restart_engine(endpoint.name, config), self._loop)
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

    def start_words(self, names: list[str]) -> str:
        """How long these engines' last starts took, for the page while they restart."""
        starts = self.session.start_s if self.session else {}
        took = [f"{name} took {starts[name]:.0f} s" for name in names if name in starts]
        return "its last start " + ", ".join(took) if took else "first start"

    async def _restart(self, names: list[str]) -> bool:
        """Restart each engine with its own settings; True when all came back."""
        ok = True
        for name in names:
            self.deaths[name] = self.deaths.get(name, 0) + 1
            self.restarting.add(name)
            self.restart_errors.pop(name, None)
            self.bump()
            try:
                await self.session.restart_engine(name, self.session.configs.get(name, self.config))
                log.info("%s restarted in %.1f s", name, self.session.start_s[name])
            except Exception as exc:
                log.exception("restarting %s failed", name)
                self.restart_errors[name] = f"restarting {name} failed: {type(exc).__name__}: {exc}"
                ok = False
            finally:
                self.restarting.discard(name)
                self.bump()
        return ok

    def status_text(self, health: dict[str, dict] | None = None) -> str:
        """The header line: loading progress, or each engine's health once loaded (``health`` when just read)."""
        if not self.status.ready:
            return self.status.text()
        health = self.health() if health is None else health
        if all(h["state"] == EngineHealth.ALIVE for h in health.values()):
            return "Engines ready."
        dead = self.dead(health)
        refused = self.refuse_restart(dead)
        hint = "" if not dead else f" {refused}" if refused else (
            " Press **Restart dead engines**, or Run (it restarts them first).")
        return "Engines: " + "; ".join(self._health_words(name, h) for name, h in health.items()) + "." + hint

    def _health_words(self, name: str, health: dict) -> str:
        if health["state"] == EngineHealth.DEAD:
            return f"**{name} dead**: {health['reason']}"
        if health["state"] == EngineHealth.RESTARTING:
            return f"**{name} restarting** ({self.start_words([name])})"
        return f"{name} {health['state']}"

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
        """Run ``coro`` as the one task on the host's loop; its end bumps the version (a sweep's restore and
        last words, an experiment's, change what a page draws without a run's observer to say so)."""
        async def start() -> None:
            self._task = asyncio.ensure_future(coro)
            self._task.add_done_callback(lambda _: self.bump())

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
    def on_loop(self, fn, timeout_s: float | None = None):
        """``fn()`` called on the host's event loop, where runs and engines change what they hold: a copy made
        there is consistent (lab.host_process cuts the page's parts so). Raises TimeoutError past ``timeout_s``."""
        async def call():
            return fn()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

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
            "health": self.health(),
            "process_rss_bytes": process_rss_bytes(),
            "load_status": self.status_text(),
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
            asyncio.run_coroutine_threadsafe(self.session.stop(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        log.info("engines stopped in %.1f s", time.monotonic() - began)
