"""app.py as a user starts and stops it: a real process, stopped by SIGTERM and Ctrl-C. Its engine is vLLM alone, the
one that runs processes of its own (HF computes inside the app's process): two apps with HF beside each cost CI
~20 s of CPU more while the browser files run beside them, and leave no more to check."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.ui_kit import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def start_apps(folder: Path, count: int, apps: list) -> None:
    """``count`` app.py processes started together into ``apps`` (their engines' starts overlap, one per core), each
    on a free port with its log in FOLDER/app-N.log; returns once each says its engine is ready."""
    logs = [folder / f"app-{n}.log" for n in range(count)]
    for log_path in logs:
        apps.append(subprocess.Popen([sys.executable, "app.py", "--port", str(free_port()), "--max-model-len", "1024",
                                      "--engines", "vllm"],
                                     cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"}))
    deadline = time.monotonic() + 300
    for app, log_path in zip(apps, logs, strict=True):
        while "engines ready" not in log_path.read_text():
            assert app.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)


@pytest.fixture
def two_apps(tmp_path):
    apps = []
    try:
        start_apps(tmp_path, 2, apps)
        yield apps
    finally:
        for app in apps:
            if app.poll() is None:
                app.kill()


def test_the_app_stops_quickly_on_sigterm_and_on_ctrl_c_and_leaves_no_engine_process(two_apps):
    for app, sig in zip(two_apps, (signal.SIGTERM, signal.SIGINT), strict=True):
        children = psutil.Process(app.pid).children(recursive=True)
        assert children, "vLLM's engine processes run as children of the app"
        began = time.monotonic()
        app.send_signal(sig)
        app.wait(60)
        took_s = time.monotonic() - began
        gone, alive = psutil.wait_procs(children, timeout=5)
        print(f"{signal.Signals(sig).name}: the app exited in {took_s:.1f} s; {len(gone)} engine processes gone")
        assert not alive, [p.pid for p in alive]
        assert took_s < 5, f"stopping took {took_s:.1f} s"  # measured: ~1.2 s on 2 cores
