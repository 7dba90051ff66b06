"""The repository is a Hugging Face Space: README.md's front matter, read with huggingface_hub's card tools, names
an app file that exists and the gradio version requirements.txt pins (a Space installs gradio from sdk_version);
and app.py started as a Space starts it serves the page, the presenter's link and the /dev/shm warning a Space needs
(slow). Whether requirements.txt resolves is bench/space_resolve.py's to say: it downloads ~4.4 GB."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from huggingface_hub import RepoCard, SpaceHardware

from tests.test_app import free_port

ROOT = Path(__file__).resolve().parents[1]


def pinned(requirements: Path, package: str) -> str | None:
    """The version ``package==X`` pins in a requirements file (None when it is not pinned)."""
    found = re.search(rf"^{re.escape(package)}==([^\s#]+)", requirements.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def test_the_front_matter_is_a_space_card_that_matches_the_repository():
    import gradio

    card = RepoCard.load(ROOT / "README.md", repo_type="space")
    meta = card.data.to_dict()
    assert (ROOT / "README.md").read_text().startswith("---\n")
    assert meta["sdk"] == "gradio" and (ROOT / meta["app_file"]).is_file()
    assert meta["sdk_version"] == pinned(ROOT / "requirements.txt", "gradio") == gradio.__version__
    assert pinned(ROOT / "requirements-cpu.txt", "gradio") in (None, meta["sdk_version"])
    assert meta["title"] and meta["emoji"] and 0 < len(meta["short_description"]) <= 60
    assert re.fullmatch(r"3\.\d+", str(meta["python_version"]))
    assert meta["suggested_hardware"] in {h.value for h in SpaceHardware}
    assert not meta["suggested_hardware"].startswith(("cpu", "zero")), "vLLM needs a dedicated GPU"


def test_the_presenters_link_names_the_spaces_own_address_on_a_space(monkeypatch):
    from app import page_address, parse_args, reachable_address

    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SPACE_HOST", raising=False)
    served = page_address(parse_args(["--host", "0.0.0.0", "--port", "8000"]))  # bound to all: what others reach
    assert served == f"http://{reachable_address()}:8000" and "127.0.0.1" not in served
    assert page_address(parse_args(["--host", "10.0.0.5", "--port", "8000"])) == "http://10.0.0.5:8000"
    monkeypatch.setenv("SPACE_HOST", "someone-kv-lab.hf.space")
    assert page_address(parse_args([])) == "https://someone-kv-lab.hf.space"


# -- a Space's first start, rehearsed (docs/space.md) --------------------------------------------------------------

SPACE_HOST = "someone-kv-lab.hf.space"
SECRET = "rehearsal-secret-0123"  # the Space's KVLAB_PRESENTER_TOKEN secret
READ_BY_APP = ("SPACE_ID", "SPACE_HOST", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "KVLAB_PRESENTER_TOKEN",
               "KVLAB_ENDPOINTS", "KVLAB_SHM_PATH")


def space_env(port: int, shm: Path, **more: str) -> dict[str, str]:
    """What a Space sets that app.py reads (SPACE_ID, SPACE_HOST, GRADIO_SERVER_PORT: a free port stands in for
    7860), and ``shm`` standing in for /dev/shm; the machine's own values of them left out."""
    env = {k: v for k, v in os.environ.items() if k not in READ_BY_APP}
    return {**env, "SPACE_ID": "someone/kv-lab", "SPACE_HOST": SPACE_HOST, "GRADIO_SERVER_PORT": str(port),
            "KVLAB_SHM_PATH": str(shm), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", **more}


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


def wait_for_page(app: subprocess.Popen, port: int, log_path: Path, deadline: float) -> tuple[int, str]:
    """The page's first answer (status, body), once the app serves it."""
    while True:
        assert app.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        try:
            return get(f"http://127.0.0.1:{port}/")
        except OSError:
            time.sleep(0.5)


def listening_hosts(app: subprocess.Popen, port: int) -> set[str]:
    """The addresses the app's process listens on at ``port``."""
    return {c.laddr.ip for c in psutil.Process(app.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


@pytest.mark.slow
def test_a_spaces_first_start_serves_the_page_with_the_presenters_link_and_the_shm_warning(tmp_path):
    """Two starts of app.py as a Space runs it, side by side: one with the presenter's token as the Space's secret,
    one without (app.py makes a token and prints the link). Only the HF engine is asked for: the page answers
    before the engines load, and nothing here waits for them."""
    small_shm = tmp_path / "shm-missing"  # holds 0 bytes: the warning a Space with too little /dev/shm logs
    starts = {
        # the secret set, GRADIO_SERVER_NAME not: app.py binds 0.0.0.0 because SPACE_ID is set
        "secret": space_env(free_port(), small_shm, KVLAB_PRESENTER_TOKEN=SECRET),
        # no secret, GRADIO_SERVER_NAME as Spaces' gradio image sets it
        "made": space_env(free_port(), small_shm, GRADIO_SERVER_NAME="0.0.0.0"),
    }
    apps, logs = {}, {name: tmp_path / f"{name}.log" for name in starts}
    began = time.monotonic()
    try:
        for name, env in starts.items():
            apps[name] = subprocess.Popen([sys.executable, "app.py", "--engines", "hf"], cwd=ROOT, env=env,
                                          stdout=logs[name].open("w"), stderr=subprocess.STDOUT)
        pages = {name: wait_for_page(apps[name], int(env["GRADIO_SERVER_PORT"]), logs[name], began + 120)
                 for name, env in starts.items()}
        print(f"both pages answered {time.monotonic() - began:.1f} s after the start")
        for name, env in starts.items():
            port = int(env["GRADIO_SERVER_PORT"])
            status, body = pages[name]
            assert status == 200 and "<html" in body.lower(), name
            assert listening_hosts(apps[name], port) == {"0.0.0.0"}, name
            status, config = get(f"http://127.0.0.1:{port}/config")
            assert status == 200 and f"{small_shm} holds 0.00 GiB" in config, "the page's header shows the warning"
            log = logs[name].read_text()
            warned = [line for line in log.splitlines() if f"{small_shm} holds 0.00 GiB, below the 1.00 GiB" in line]
            assert warned and "WARNING" in warned[0], log[-3000:]

        secret_log = logs["secret"].read_text()
        assert "presenter: the token in KVLAB_PRESENTER_TOKEN" in secret_log, secret_log[-3000:]
        assert "Presenter's link" not in secret_log and SECRET not in secret_log, "the secret is never printed"
        assert "endpoints are off on this Space" in secret_log

        made_log = logs["made"].read_text()
        link = re.search(r"Presenter's link \(attendees open the page without the token\): (\S+)", made_log)
        assert link, made_log[-3000:]
        assert re.fullmatch(rf"https://{re.escape(SPACE_HOST)}/?\?token=[\w-]{{12,}}", link.group(1)), link.group(1)
    finally:
        for app in apps.values():
            if app.poll() is None:
                app.send_signal(signal.SIGTERM)
        for app in apps.values():
            try:
                app.wait(30)
            except subprocess.TimeoutExpired:
                app.kill()
    print(f"the rehearsal took {time.monotonic() - began:.1f} s")


def test_the_shm_check_reads_the_path_kvlab_shm_path_names(monkeypatch, tmp_path):
    from lab.environment import SHM_PATH_ENV, shm_warning

    monkeypatch.setenv(SHM_PATH_ENV, str(tmp_path / "missing"))
    assert shm_warning().startswith(f"{tmp_path / 'missing'} holds 0.00 GiB, below the 1.00 GiB")
    monkeypatch.setenv(SHM_PATH_ENV, str(tmp_path))  # a folder on this machine's disk: more than 1 GiB
    assert shutil.disk_usage(tmp_path).total >= 1024**3 and shm_warning() == ""
    assert shm_warning(str(tmp_path / "missing")) != "", "a path given wins over the variable"
    monkeypatch.delenv(SHM_PATH_ENV)
    assert shm_warning(min_bytes=10**18).startswith("/dev/shm holds "), "without it: /dev/shm"


def test_the_resolve_script_sets_each_pin_beside_what_resolved_and_torch_beside_vllms_pin(tmp_path):
    """bench/space_resolve.py's reading of pip's report (the resolve itself downloads ~4.4 GB: no test runs it)."""
    from bench.space_resolve import compare, pins

    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# the stack\nvllm==0.32.0\ntransformers==5.19.0  # note\ngradio==6.31.0\ntqdm\n")
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}

    def report(torch: str, gradio: str = "6.31.0") -> dict:
        vllm = {"name": "vllm", "version": "0.32.0", "requires_dist": [
            "transformers<5.20.0,>=5.16.1", 'zentorch==2.13.0.1; extra == "zen"', "torch==2.13.0"]}
        return {"environment": env, "install": [{"metadata": m} for m in (
            vllm, {"name": "Transformers", "version": "5.19.0"}, {"name": "gradio", "version": gradio},
            {"name": "torch", "version": torch}, {"name": "tqdm", "version": "4.70.1"})]}

    assert pins(requirements) == {"vllm": "0.32.0", "transformers": "5.19.0", "gradio": "6.31.0"}
    rows, ok = compare(report("2.13.0"), pins(requirements))
    assert ok and ("torch", "2.13.0 (vllm's)", "2.13.0", True) in rows
    assert compare(report("2.13.0+cpu"), pins(requirements))[1], "a local label is not a mismatch"
    assert not compare(report("2.12.0"), pins(requirements))[1]
    rows, ok = compare(report("2.13.0", gradio="6.30.0"), pins(requirements))
    assert not ok and ("gradio", "6.31.0", "6.30.0", False) in rows
