"""app.py as a user starts and stops it: a real process with both engines, stopped by SIGTERM and Ctrl-C."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(log_path: Path) -> subprocess.Popen:
    """app.py on a free port, its log in log_path, once it says both engines are ready."""
    log = log_path.open("w")
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(free_port()), "--max-model-len", "1024"],
                           cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 300
    while "engines ready" not in log_path.read_text():
        assert app.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.5)
    return app


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_app_stops_quickly_and_leaves_no_engine_process(tmp_path, sig):
    app = start_app(tmp_path / "app.log")
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
