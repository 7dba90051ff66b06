"""The real dashboard with the real engines (CPU): through gradio_client and in headless Chromium."""

import json
import os
import socket
import time
from pathlib import Path

import pytest

from lab.config import EngineConfig
from lab.host import LabHost

pytestmark = pytest.mark.ui
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PLOTS = ["plot-throughput", "plot-bars", "plot-ratio", "plot-queue", "plot-vllm-kv", "plot-hf-kv"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app of app.py (same host, same build_app), served on a free port, engines loaded."""
    from lab.ui import build_app

    host = LabHost(EngineConfig(device="cpu", max_model_len=1024, kv_cache_gib=0.5),
                   db_path=tmp_path_factory.mktemp("db") / "results.sqlite")
    host.start_loading()
    app = build_app(host)
    port = free_port()
    app.queue(default_concurrency_limit=8).launch(server_name="127.0.0.1", server_port=port,
                                                  prevent_thread_lock=True, quiet=True)
    assert host.wait_ready(timeout_s=300), host.status.text()
    yield host, f"http://127.0.0.1:{port}/"
    app.close()
    host.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run `make setup-dev`")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def test_api_runs_and_reads_results_back(served):
    host, url = served
    c = client(url)
    summary = json.loads(c.predict("hf,vllm", "1,2", "mixed", 8, 1, api_name="/run_and_wait"))
    assert summary["status"] == "ok"
    assert {(r["engine"], r["users"]) for r in summary["runs"]} == {("hf", 1), ("vllm", 1), ("hf", 2), ("vllm", 2)}
    assert all(r["output_tokens"] == 8 * r["users"] for r in summary["runs"])
    assert set(summary["ratio"]) == {"1", "2"}
    rows, _ = c.predict(api_name="/load_runs")
    run_ids = [row[0] for row in rows["data"]]
    assert summary["run_id"] in run_ids
    *_, csv_path, json_path = c.predict([summary["run_id"]], api_name="/compare")
    assert len(Path(csv_path).read_text().splitlines()) == 1 + 6
    assert json.loads(Path(json_path).read_text())["run_id"] == summary["run_id"]
    error = json.loads(c.predict("hf", "0", "mixed", 8, 1, api_name="/run_and_wait"))
    assert ">= 1" in error["error"]


def wait_text(page, selector, text, timeout_s):
    page.wait_for_function(
        "([sel, text]) => { const e = document.querySelector(sel); return e && e.innerText.includes(text); }",
        arg=[selector, text], timeout=timeout_s * 1000)


def open_ready(browser, url, **options):
    """A new page on the app, once it says the engines are ready."""
    page = browser.new_page(**options)
    page.goto(url)
    wait_text(page, "#load-status", "Engines ready", 60)
    return page


def submit(page, users, output_len, amount=None):
    """Fill the load-test form and press Run."""
    page.fill("#users textarea", users)
    page.fill("#output-len input", str(output_len))
    if amount is not None:
        page.fill("#amount input", str(amount))
    page.click("#run")


def test_browser_run_draws_both_engines(served, browser, tmp_path):
    host, url = served
    page = open_ready(browser, url, viewport={"width": 1400, "height": 2300})
    submit(page, "1,5", 12, 1)
    wait_text(page, "#message", "started", 30)
    run_id = page.inner_text("#message").split()[1]
    wait_text(page, "#progress", f"Run {run_id} done (", 300)
    time.sleep(1.5)  # one more timer tick draws the final figures
    for plot in PLOTS:
        assert page.eval_on_selector(f"#{plot}", "e => e.querySelectorAll('g.trace').length") >= 1, plot
    for plot in ("plot-throughput", "plot-bars", "plot-queue"):
        text = page.inner_text(f"#{plot}")
        assert "HF generate" in text and "vLLM" in text, plot
    ratio_text = page.inner_text("#plot-ratio")
    assert ratio_text.count("x\n") >= 2 or ratio_text.count("x") >= 2
    assert "blocks x 128 tokens" in page.inner_text("#plot-vllm-kv")
    table = page.inner_text("#latency")
    assert "hf" in table and "vllm" in table
    shot = Path(os.environ.get("KVLAB_SCREENSHOT", tmp_path / "dashboard.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.close()


@pytest.mark.parametrize("users, output_len, expected", [
    ("", 0, "at least one user level"),
    ("0", 0, ">= 1"),
    ("5,-2", 0, ">= 1"),
    ("1", 5000, "max_model_len 1024"),
])
def test_bad_input_shows_a_message_and_the_app_keeps_serving(served, browser, users, output_len, expected):
    host, url = served
    page = open_ready(browser, url)
    submit(page, users, output_len)
    wait_text(page, "#message", expected, 20)
    assert "Input error" in page.inner_text("#message")
    assert not host.running()
    page.close()
    assert client(url).predict(api_name="/cancel") == "No run in progress."


def test_second_browser_watches_and_cancel_keeps_partial_results(served, browser):
    host, url = served
    first, second = open_ready(browser, url), open_ready(browser, url)
    submit(first, "4", 64, 5)
    wait_text(first, "#message", "started", 30)
    wait_text(second, "#progress", "Running", 30)
    second.click("#run")
    wait_text(second, "#message", "already in progress", 20)
    while not any(r.status == "ok" for lvl in host.result.levels for r in lvl.records):
        time.sleep(0.2)
    clicked = time.monotonic()
    second.click("#cancel")
    wait_text(first, "#progress", "cancelled", 30)
    assert host.wait_run(10).status == "cancelled"
    assert time.monotonic() - clicked < 6  # stops within about two seconds (+ the page's 1 s timer)
    rows, _ = client(url).predict(api_name="/load_runs")
    stored = {row[0]: row for row in rows["data"]}
    assert host.result.run_id in stored and "cancelled" in stored[host.result.run_id]
    first.close()
    second.close()
