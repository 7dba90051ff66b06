"""lab.app.host_process: the engine host in its own process, as app.py runs it (no engine loaded here: the
loaded path runs in tests/test_ui.py, tests/test_ui_tabs.py and tests/test_app.py)."""

import os
import pickle
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from lab.app.host_process import HostGone, RemoteHost, _cut
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.status import RunStatus
from lab.sweeps import SweepResult


@pytest.fixture
def host(tmp_path):
    host = RemoteHost(EngineConfig(device="cpu"), db_path=tmp_path / "results.sqlite")
    yield host
    host.close()


def test_a_bad_config_is_refused_in_the_apps_process_and_the_host_process_leaves(tmp_path):
    with pytest.raises(ValueError, match="block_size=17: vLLM's CPU build needs a multiple of 32"):
        RemoteHost(EngineConfig(device="cpu", block_size=17), db_path=tmp_path / "results.sqlite")
    assert not [p for p in psutil.Process().children() if "lab.app.host_process" in command_line(p)]


def command_line(process: psutil.Process) -> list[str]:
    """A child's command line; [] for one that has exited (a zombie left by an earlier test in this worker)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_before_loading_the_page_reads_the_hosts_state_and_calls_reach_it(host, tmp_path):
    assert host._pid != os.getpid() and host.db_path == tmp_path / "results.sqlite"
    assert host.status_text().startswith("Loading") and not host.status.ready
    assert {h["state"] for h in host.health().values()} == {"loading"} and host.dead() == []
    started, message = host.submit(RunPlan(engines=("hf",), load=LoadConfig(users=(1,))))
    assert not started and message.startswith("Loading")  # LabHost's own refusal, from the host process
    assert host.cancel() == "No run in progress." and not host.running() and host.task is None
    assert host.environment()["process_rss_bytes"] > 0


def test_close_stops_the_host_process(host):
    began = time.monotonic()
    host.close()
    assert host._process.returncode == 0 and time.monotonic() - began < 5


def test_the_host_process_leaves_when_the_app_is_gone(host):
    host._process.stdin.close()  # what the app's death does to the pipe
    assert host._process.wait(10) == 0


def test_a_killed_host_process_is_named_on_the_page_and_in_calls(host):
    os.kill(host._pid, signal.SIGKILL)
    host._process.wait(10)
    with pytest.raises(HostGone, match=r"exited \(signal 9\)"):
        host.cancel()
    began = time.monotonic()
    assert not host.wait_ready(10) and time.monotonic() - began < 5  # it returns: loading failed
    assert host.status_text().startswith("**Engines gone:** the engine host process exited (signal 9)")
    assert host.status.error and not host.status.ready  # the page's Run and demo buttons go grey
    assert {h["state"] for h in host.health().values()} == {"dead"} and not host.running()
    assert host.wait_task(None) is None  # returns at once


def test_the_host_cuts_while_a_run_goes_and_once_its_version_moved():
    """A sweep's load runs bump no version: it is cut at every sync while it runs; its last words (its restore,
    its status) come with the bump of its task's end (tests/test_host.py)."""
    sweep = SweepResult(plan=None, model="m", status=RunStatus.OK, message="vllm restored with the session's setting")
    host = SimpleNamespace(version=7, running=lambda: True, tasks={"sweep": sweep})
    assert _cut(host, 7, {})[2] is not None
    host.running = lambda: False
    assert _cut(host, 7, {})[2] is None  # nothing moved
    host.version = 8
    version, running, parts = _cut(host, 7, {})
    assert (version, running) == (8, False) and pickle.loads(parts)["sweep"].message == sweep.message


def test_a_capacity_searchs_probes_cross_as_its_run_does_not_whole_at_every_sync():
    """A search keeps each probe's level (every request) in its own list and in its run: the run crosses cut, the
    list not at all (pickled whole four times a second, it would take the engines' loop's time); the mirror's list
    is its run's."""
    from bench.redraw_cost import made_up_run
    from lab.app.mirror import apply, cut, hold
    from lab.capacity import CapacityResult, capacity_plan

    run = made_up_run([1, 2, 4], 3, 16, 1)
    search = CapacityResult(plan=capacity_plan("ttft_p95=2s", ("vllm",), None), run=run, levels=list(run.levels))
    mirror = apply(None, pickle.loads(pickle.dumps(cut(search, None))))
    assert mirror.levels is mirror.run.levels and len(mirror.levels) == 3 and mirror.to_dict()["slo"] == "ttft_p95=2s"
    again = cut(search, hold(mirror, False))
    assert again.levels is None and len(pickle.dumps(again)) < len(pickle.dumps(search)) / 4


FORK_WHILE_WATCHING = """
import multiprocessing, sys, threading, time
from lab.app.host_process import wait_for_eof
threading.Thread(target=wait_for_eof, daemon=True).start()
time.sleep(0.2)
child = multiprocessing.get_context("fork").Process(target=print, args=("child ran",))
child.start()
child.join(10)
sys.exit(child.exitcode)
"""


def test_a_process_forked_while_the_host_watches_its_pipe_runs():
    """vLLM forks its engine core on CUDA: a watcher holding sys.stdin's lock made that child hang."""
    done = subprocess.run([sys.executable, "-c", FORK_WHILE_WATCHING], stdin=subprocess.PIPE, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "child ran" in done.stdout, done.stderr
