"""A new engine through its registry entry and its adapter alone: the lab's load test and a sweep over its knob run
on it, with no other module touched (the ladder with it as a rung runs beside the real engines, in
tests/test_sweeps.py, which imports ECHO from here).

The adapter is a stand-in that echoes one token id per step, fast: the session loads the tokenizer and no model.
"""

from __future__ import annotations

import contextlib

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.base import EngineInfo
from lab.engines.fake import FakeEngine
from lab.engines.registry import EngineSpec, Rung, register, unregister
from lab.status import RunStatus

CPU = EngineConfig(device="cpu", max_model_len=512, seed=3)
LOAD = LoadConfig(users=(1, 3), requests_per_user=2, workload="equal", output_len=8, warmup_requests=1)


class EchoEngine(FakeEngine):
    """An adapter as a new engine would bring one (here the fake engine's streaming, one token per event-loop turn),
    echoing its config's seed as its one token id."""

    def __init__(self, config: EngineConfig, model_path: str):
        super().__init__("echo", max_model_len=config.max_model_len, token_id=config.seed)
        self.config, self.model_path = config, model_path

    async def start(self) -> EngineInfo:
        self.info = EngineInfo(name=self.name, args={"seed": self.config.seed})
        return self.info


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
