"""`python -m lab report`: a run as one HTML file that opens with no network (lab.report, lab.plots_report).

The run is a chat run on fake engines (the real-engine report is in test_engines.py): what is tested here is the
page, opened in chromium with every request that is not the file itself refused and counted.
"""

import asyncio
from pathlib import Path

import pytest

from lab.__main__ import main
from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.runs import RunResult, execute, write_run
from tests.test_ui import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A two-engine chat run's folder and its report."""
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    folder = tmp_path_factory.mktemp("run")
    plan = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 2), requests_per_user=3, workload="chat",
                                                           output_len=3, think_s=0.0, warmup_requests=0))
    engines = {name: FakeEngine(name) for name in plan.engines}
    result = RunResult(plan=plan, model="fake", model_path="fake", device={"kind": "cpu", "name": "a CPU"}, versions={})
    asyncio.run(execute(plan, engines, AutoTokenizer.from_pretrained(resolve_model(None)), result))
    write_run(result, folder)
    assert main(["report", str(folder), "--out", str(folder / "r.html")]) == 0
    return folder / "r.html"


def test_the_report_is_one_file_with_plotly_inside(report):
    page = report.read_text()
    assert page.count("<script") >= 4 and "<script src" not in page.replace("'", '"').lower()  # plotly.js inline
    assert "Request lengths" in page and "TTFT p50 per turn" in page and "Engine args" in page


def test_an_unknown_run_is_bad_input(tmp_path, capsys):
    assert main(["report", "no-such-run", "--out", str(tmp_path / "r.html")]) == 2
    assert "no such run" in capsys.readouterr().err and not (tmp_path / "r.html").exists()


@pytest.mark.ui
def test_the_report_draws_its_plots_offline_in_chromium(report):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run `make setup-dev`")
    attempted = []

    def only_the_file(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.route("**/*", only_the_file)
        page.goto(report.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=30_000)
        bars = page.evaluate("document.querySelectorAll('.js-plotly-plot .bars path, .js-plotly-plot .points path')"
                             ".length")
        browser.close()
    assert bars > 0 and attempted == []
