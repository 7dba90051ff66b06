"""A new engine through its registry entry and its adapter alone: the lab's load test and a sweep over its knob run
on it, with no other module touched (the ladder with it as a rung runs beside the real engines, in
tests/test_sweeps.py, which imports ECHO from here).

The adapter is a stand-in that echoes one token id per step, fast: the session loads the tokenizer and no model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.base import EngineInfo, EngineSample, GenRequest, RequestRejected, TokenChunk, check_fits
from lab.engines.registry import EngineSpec, Rung, register, unregister
from lab.status import RunStatus

CPU = EngineConfig(device="cpu", max_model_len=512, seed=3)
LOAD = LoadConfig(users=(1, 3), requests_per_user=2, workload="equal", output_len=8, warmup_requests=1)


class EchoEngine:
    """Streams ``max_tokens`` copies of one token id (its config's seed), one per event-loop turn."""

    name = "echo"

    def __init__(self, config: EngineConfig, model_path: str):
        self.config, self.model_path = config, model_path
        self._running, self._samples, self.info = 0, [], None

    async def start(self) -> EngineInfo:
        self.info = EngineInfo(name=self.name, args={"seed": self.config.seed})
        return self.info

    def check(self, request: GenRequest) -> str | None:
        return check_fits(request, self.config.max_model_len)

    async def stream(self, request: GenRequest):
        if problem := self.check(request):
            raise RequestRejected(problem)
        self._running += 1
        try:
            for _ in range(request.max_tokens):
                await asyncio.sleep(0)
                self._samples.append(EngineSample(self.name, time.perf_counter(), self._running, 0))
                yield TokenChunk(time_s=time.perf_counter(), token_ids=(self.config.seed,))
        finally:
            self._running -= 1

    def drain_samples(self) -> list[EngineSample]:
        taken, self._samples = self._samples, []
        return taken

    async def reset(self) -> None:
        self._samples = []

    async def abort_all(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def fault(self) -> str | None:
        return None

    def decode(self, token_ids: list[int]) -> str:
        return " ".join(map(str, token_ids))


ECHO = EngineSpec("echo", "Echo", "tests.test_new_engine:EchoEngine", "a stand-in that echoes one token id",
                  color="#222222", memory="nothing", knobs=("seed",),
                  rungs=(Rung("echo", 12, "a stand-in echoing one token id", "echoing instead of computing"),))


@contextlib.contextmanager
def registered():
    """ECHO in the registry while the block runs, removed after."""
    register(ECHO)
    try:
        yield ECHO
    finally:
        unregister(ECHO.name)


@pytest.fixture(scope="module")
def echo_session():
    """A session holding only the echo engine (the tokenizer loads; no model does)."""
    from tests.conftest import running_session

    with registered():
        yield from running_session(CPU, engines=("echo",))


def test_the_registry_entry_alone_brings_its_knob_rung_and_memory_kind():
    from lab.environment import DeviceInfo
    from lab.experiments.ladder import CHAIN, RUNGS
    from lab.memory import plan_memory
    from lab.plots import ENGINE_COLORS, ENGINE_LABELS
    from lab.sweeps import KNOBS

    assert "echo" not in KNOBS.values() and "echo" not in RUNGS
    with pytest.raises(ValueError, match="unknown engine 'echo'"):
        RunPlan(engines=("echo",), load=LOAD, engine=CPU)
    cpu = DeviceInfo("cpu", "CPU", 4 * 2**30, 2 * 2**30, 2, "test")
    with registered():
        assert KNOBS["seed"] == "echo" and list(CHAIN)[:3] == ["hf", "echo", "hf-cb"]
        assert plan_memory(CPU, cpu, ("echo",), 2**28, 23040).shares == {}  # it holds nothing on this device
        assert (ENGINE_COLORS["echo"], ENGINE_LABELS["echo"]) == (ECHO.color, ECHO.description)  # its plots' look
    assert "seed" not in KNOBS and "echo" not in RUNGS and "echo" not in ENGINE_COLORS


def test_a_load_test_runs_on_the_new_engine(echo_session):
    plan = RunPlan(engines=("echo",), load=LOAD, engine=CPU)
    result = echo_session.loop.run_until_complete(echo_session.run(plan))
    assert result.status == RunStatus.OK, result.error
    done = [lvl.summary for lvl in result.levels if lvl.summary is not None]
    assert [(s.engine, s.users, s.completed) for s in done] == [("echo", 1, 2), ("echo", 3, 6)]
    assert all(s.output_tokens == 8 * s.completed and s.output_tok_s > 0 for s in done)
    assert echo_session.held_bytes("echo") == 0


def test_a_sweep_runs_over_the_new_engines_knob(echo_session):
    from lab.sweeps import SweepPlan, run_sweep

    result = echo_session.loop.run_until_complete(run_sweep(echo_session, SweepPlan("seed", (5, 3), LOAD)))
    assert result.status == RunStatus.OK, result.error
    assert [(p["value"], p["engine_arg"]) for p in result.points] == [(5, "seed=5"), (3, "seed=3")]
    assert all(p["output_tok_s@3"] > 0 for p in result.points)
    assert echo_session.configs["echo"] == CPU  # the last value was the session's own: nothing to restore
