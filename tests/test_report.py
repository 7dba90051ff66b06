"""`python -m lab report`: a run, an experiment, a why ladder or a sweep as one HTML file that opens with no
network (lab.report, lab.plots_report).

The run is a chat run on fake engines (the real-engine report is in test_engines.py); the experiment, ladder and
sweep are recorded results (docs/results) stored in a temporary database. What is tested here is the page: the
figure's data and the computed sentences in it, nothing it would fetch, and in chromium every request that is not
the file itself refused and counted.
"""

import asyncio
import html
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.__main__ import main
from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.experiments import ExperimentResult, parse_params, stored_fields
from lab.report import write_report
from lab.runs import RunResult, execute, write_run
from lab.sentences import waste_answer
from lab.status import RunStatus
from lab.store import save
from lab.sweeps import SweepPlan, SweepResult
from tests.test_ui import CHROMIUM, CHROMIUM_ARGS

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
EXPLAIN = RESULTS / "cpu-why" / "overhead" / "explain.json"
WASTE = RESULTS / "cpu-experiments" / "waste" / "experiment.json"
SWEEP = RESULTS / "h100-workshop" / "sweep-hf_max_batch_size.json"


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


def test_an_unknown_id_is_bad_input_and_says_how_to_list_the_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    assert main(["report", "no-such-run", "--out", str(tmp_path / "r.html")]) == 2
    said = capsys.readouterr().err
    assert "no such run, experiment or sweep: nothing stored as 'no-such-run'" in said and "report --list" in said
    assert not (tmp_path / "r.html").exists()
    assert main(["report", "--out", str(tmp_path / "r.html")]) == 2 and "--list" in capsys.readouterr().err


def store_experiment(db: Path, recorded: Path) -> dict:
    """A recorded experiment.json (or explain.json) stored as the app stores an ended experiment; its dict."""
    data = json.loads(recorded.read_text())
    save(db, ExperimentResult(
        experiment=data["experiment"], params=parse_params(data["experiment"], data["params"]),
        fields=stored_fields(data), series=data["series"], model=data["model"], device=data["device"],
        versions=data["versions"], engine_args=data["engine_args"], id=data["experiment_id"],
        started_at=data["started_at"], status=RunStatus(data["status"])))
    return data


def store_sweep(db: Path, recorded: Path) -> dict:
    """A recorded sweep.json stored as the app stores a sweep; its dict."""
    data = json.loads(recorded.read_text())
    load = LoadConfig(users=tuple(data["load"]["users"]), workload=data["load"]["workload"],
                      requests_per_user=data["load"]["requests_per_user"], output_len=data["load"]["output_len"])
    save(db, SweepResult(plan=SweepPlan(data["knob"], tuple(data["values"]), load), points=data["points"],
                         model=data["model"], device=data["device"], versions=data["versions"], id=data["sweep_id"],
                         started_at=data["started_at"], status=RunStatus(data["status"])))
    return data


def figures(page: str) -> list[dict]:
    """The plotly figures' data written into the page (each ``Plotly.newPlot(id, data, layout, ...)``)."""
    return [json.loads(f"[{m}]")[0] for m in re.findall(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', page)]


def offline(page: str) -> bool:
    """Nothing the page would fetch: no script or link by address, and no address outside its scripts."""
    outside = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    return "<script src" not in page.replace("'", '"').lower() and not re.search(r"https?://", outside)


def test_a_stored_why_ladder_reports_its_figure_caption_and_factors(tmp_path):
    db = tmp_path / "r.sqlite"
    data = store_experiment(db, EXPLAIN)
    page = write_report(data["experiment_id"], tmp_path / "why.html", db).read_text()
    ran = [name for name, rung in data["rungs"].items() if rung["tok_s"]]
    (bars,) = figures(page)
    assert bars[0]["x"] == ran and offline(page) and "why ladder" in page
    for line in data["caption"].splitlines():  # the caption explain computed, every sentence of it
        assert f"<p>{html.escape(line.removeprefix('- '))}</p>" in page
    for factor in data["factors"]:
        assert f"<td>{factor['lower']} → {factor['upper']}</td>" in page
        assert f"<td>{factor['value']:.2f}</td>" in page
    assert all(html.escape(f'"{name}": "{version}"') in page for name, version in data["versions"].items())


def test_a_stored_experiment_reports_its_figure_sentences_fields_and_engine_args(tmp_path):
    db = tmp_path / "r.sqlite"
    data = store_experiment(db, WASTE)
    page = write_report(data["experiment_id"], tmp_path / "waste.html", db).read_text()
    traces = figures(page)[0]
    held = next(t for t in traces if t["name"].startswith("HF: held"))
    assert held["y"] == [row[1] for row in data["series"]["hf"]] and offline(page)
    assert f"{data['hf']['waste_pct']['mean']}% wasted" in held["name"]
    for line in waste_answer(data):
        assert f"<p>{html.escape(line)}</p>" in page
    assert "kv_cache_memory_bytes" in page and "Parameters" in page and "experiment waste" in page


def test_a_stored_sweep_reports_its_figure_points_and_sentences(tmp_path):
    db = tmp_path / "r.sqlite"
    data = store_sweep(db, SWEEP)
    page = write_report(data["sweep_id"], tmp_path / "sweep.html", db).read_text()
    tok_s = next(t for t in figures(page)[0] if t["name"] == "tok/s, 32 users")
    assert tok_s["x"] == [str(v) for v in data["values"]] and tok_s["y"] == [p["output_tok_s@32"] for p in
                                                                             data["points"]]
    first, last = data["points"][0], data["points"][-1]
    gain = last["output_tok_s@32"] / first["output_tok_s@32"]
    assert f"Peak reserved KV: {first['kv_peak_reserved_bytes@32'] / 2**20:.1f} MiB at batch {first['value']}" in page
    assert f"({gain:.2f}x, measured)" in page and "<td>max_batch_size=32</td>" in page and offline(page)


def test_a_failed_sweep_reports_its_error_and_no_sentence_its_one_value_cannot_hold(tmp_path):
    db = tmp_path / "r.sqlite"
    point = json.loads(SWEEP.read_text())["points"][0]
    save(db, SweepResult(plan=SweepPlan("hf_max_batch_size", (4, 8), LoadConfig(users=(32,))), points=[point],
                         model="m", id="failedsweep1", status=RunStatus.FAILED, error="EngineFault: hf died"))
    page = write_report("failedsweep1", tmp_path / "r.html", db).read_text()
    assert "<td>failed (EngineFault: hf died)</td>" in page and "Peak reserved KV" not in page
    assert "<td>max_batch_size=4</td>" in page


def test_a_folder_explain_wrote_is_reported_and_list_prints_the_stored_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    assert main(["report", str(EXPLAIN.parent), "--out", str(tmp_path / "why.html")]) == 0
    assert "why ladder (lab explain)" in (tmp_path / "why.html").read_text()
    store_sweep(tmp_path / "results.sqlite", SWEEP)
    store_experiment(tmp_path / "results.sqlite", EXPLAIN)
    capsys.readouterr()
    assert main(["report", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [["b0d62d62f4f4", "experiment", "why"],
                                                    ["324d922a6f2f", "sweep", "hf_max_batch_size"]]


def test_the_why_and_sweeps_tabs_give_a_stored_results_report(tmp_path):
    from lab.app.ui_sweep import SweepHandlers
    from lab.app.ui_why import WhyHandlers

    host = SimpleNamespace(db_path=tmp_path / "r.sqlite")
    ladder, sweep = store_experiment(host.db_path, EXPLAIN), store_sweep(host.db_path, SWEEP)
    why_report = Path(WhyHandlers(host).show_stored(ladder["experiment_id"])[-1])
    sweep_report = Path(SweepHandlers(host).show(sweep["sweep_id"])[-1])
    assert "why ladder" in why_report.read_text() and "sweep of hf_max_batch_size" in sweep_report.read_text()


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
