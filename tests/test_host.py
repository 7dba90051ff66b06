"""The app's engine host: engine health, the header line, and when it stops restarting a dead engine.

A host over fake engines (its session stands in for a loaded one); the real kill-and-restart runs in
tests/test_ui_tabs.py.
"""

import asyncio
from types import SimpleNamespace

import pytest

from lab.app.host import MAX_DEATHS, NOTHING_TO_CANCEL, RESTART_CANCELLING, LabHost
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.experiments import ExperimentPlan
from lab.tasks import KINDS, spec

DIED = "vLLM's engine process exited (signal 9, SIGKILL)"


@pytest.fixture
def host(tmp_path):
    host = LabHost(EngineConfig(device="cpu"), db_path=tmp_path / "results.sqlite")
    yield host
    host.close()


def loaded(host: LabHost) -> LabHost:
    async def stop():
        pass

    host.session = SimpleNamespace(engines={"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")},
                                   start_s={"hf": 4.0, "vllm": 27.0}, configs={}, stop=stop, probes={})
    host.status.ready = True
    return host


def test_before_loading_every_engine_is_loading(host):
    assert {h["state"] for h in host.health().values()} == {"loading"}
    assert host.status_text().startswith("Loading") and host.dead() == []


def test_a_dead_engine_is_named_with_its_reason_and_the_way_back(host):
    loaded(host)
    assert host.status_text() == "Engines ready."
    host.session.engines["vllm"].failure = DIED
    health = host.health()
    assert health["vllm"] == {"state": "dead", "reason": DIED, "last_start_s": 27.0, "probe": None}
    assert health["hf"]["state"] == "alive" and host.dead() == ["vllm"]
    line = host.status_text()
    assert f"**vLLM dead**: {DIED}" in line and "HF alive" in line and "Press" not in line  # public names; what to
    #      press lies beside the presenter's Restart button, not in a line every page shows


def test_after_repeated_deaths_the_host_stops_restarting(host):
    loaded(host)
    host.session.engines["vllm"].failure = DIED
    host.doctor.deaths["vllm"] = MAX_DEATHS
    started, message = host.restart_dead()
    assert not started and f"died {MAX_DEATHS} times in a row" in message and "restart the app" in message
    started, message = host.submit(RunPlan(engines=("vllm",), load=LoadConfig(users=(1,))))
    assert not started and "stops restarting" in message
    assert "stops restarting" in host.status_text()


def test_nothing_to_restart_when_every_engine_is_alive(host):
    loaded(host)
    assert host.restart_dead() == (False, "Every engine is alive: nothing to restart.")


def test_the_end_of_a_task_bumps_the_version(host):
    """A sweep's restore and last words change what a page draws with no run observer to say so: the task's
    end does (lab.app.host_process cuts the page's copy when the version moves)."""
    async def last_words():
        pass

    before = host.version
    host.runner.start(last_words())
    host.wait_task(5)
    assert host.on_loop(lambda: host.version) == before + 1  # read on the loop, after the task's callbacks


def test_a_dead_engine_reads_restarting_as_its_restart_starts_so_no_page_sees_a_cancel(host):
    """The restart's task and the engine's restarting state come together: a page never draws the task going with
    nothing restarting (a Cancel to press; a browser test caught that between two ticks)."""
    loaded(host)
    host.session.engines["vllm"].failure = DIED
    restart = host.doctor.restart(["vllm"])  # the coroutine, not yet run
    assert host.health()["vllm"]["state"] == "restarting"
    restart.close()


def test_a_cancel_during_a_restart_says_what_it_stops_and_the_busy_line_names_every_kind(host):
    async def slow_restart(name, config):
        await asyncio.sleep(60)

    loaded(host).session.restart_engine = slow_restart
    assert host.cancel() == NOTHING_TO_CANCEL
    host.session.engines["vllm"].failure = DIED
    assert host.restart_dead()[0]
    assert "run, experiment, sweep or capacity search" in host.busy()
    assert host.cancel() == RESTART_CANCELLING  # not a run's words: no task of a kind goes
    assert host.wait_task(5) is None and not host.running()


def test_each_kind_says_which_round_of_predictions_it_takes():
    from lab.predictions import RATIO, STEP

    run = RunPlan(engines=("hf",), load=LoadConfig(users=(1,)))
    assert spec("run").predicts(run) == RATIO and spec("experiment").predicts(ExperimentPlan("why", None)) == STEP
    assert spec("experiment").predicts(ExperimentPlan("memory", None)) is None
    assert [spec(kind).predicts(None) for kind in KINDS if kind not in ("run", "experiment")] == [None, None]
