"""`python -m lab report`: a run, an experiment, a why ladder, a sweep or a capacity search as one HTML file that
opens with no network (lab.report, lab.plots.report, lab.report.html).

The runs are recorded (docs/results), a chat run on fake engines and a run on fake engines cancelled during a level
(the real-engine report is in test_engines.py); the experiment, ladders, sweep and capacity search are recorded
results, some stored in a temporary database, one ladder and one run given the room's predictions through
lab.predictions. What is tested here is the page: the figure's data and the computed sentences in it, values as
tables (no raw JSON, no NaN, '—' said), no empty panel, nothing it would fetch, and in chromium every kind read as
a reader sees it.
"""

import asyncio
import html
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.__main__ import main
from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.experiments import ExperimentResult, parse_params, stored_fields
from lab.experiments.waste_words import waste_answer
from lab.experiments.why_words import why_caption
from lab.plots import EMPTY, EMPTY_WORDS
from lab.predictions import new_round, room_sentence
from lab.report import write_report
from lab.report.html import cell, prose
from lab.runs import RunResult, execute, write_run
from lab.status import RunStatus
from lab.store import save
from lab.sweeps import SweepPlan, SweepResult
from lab.sweeps.words import sweep_answer
from tests.conftest import CharTokenizer
from tests.test_driver import fake_result
from tests.ui_kit import CHROMIUM, CHROMIUM_ARGS

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
EXPLAIN = RESULTS / "cpu-why" / "overhead" / "explain.json"
WASTE = RESULTS / "cpu-experiments" / "waste" / "experiment.json"
SWEEP = RESULTS / "h100-workshop" / "sweep-hf_max_batch_size.json"
CHAT = RESULTS / "h100-room" / "135m-chat"  # a recorded run: summary.json and requests.csv
LADDER = RESULTS / "h200-factors" / "ladder" / "explain.json"  # a ladder of three user levels
CAPACITY = RESULTS / "h200-factors" / "capacity"
MAX_BYTES = 5 * 10**6  # a report to hand out stays under 5 MB


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
    assert "Request lengths" in page and "TTFT p50 per turn" in page
    assert "Engine args" not in page  # these engines reported none: no empty section


def test_an_unknown_id_is_bad_input_and_says_how_to_list_the_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    assert main(["report", "no-such-run", "--out", str(tmp_path / "r.html")]) == 2
    said = capsys.readouterr().err
    assert "no such run, experiment, sweep or capacity search: nothing stored as 'no-such-run'" in said
    assert "report --list" in said
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
    for line in filter(None, why_caption(stored_fields(data)).splitlines()):  # the caption, every sentence of it
        assert f">{html.escape(line.removeprefix('- '))}</" in page
    for factor in data["factors"]:
        assert f"<td>{factor['lower']} → {factor['upper']}</td>" in page
        assert f"<td class='num'>{cell(round(factor['value'], 2))}</td>" in page
    assert all(f"<th>{name}</th><td>{version}</td>" in page for name, version in data["versions"].items())
    assert "Rungs at 1 user (measured)" in page and "<th>tok/s per repeat</th>" in page


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
    assert all(f"<p>{html.escape(line)}</p>" in page for line in sweep_answer(data))
    assert f"{first['kv_peak_reserved_bytes@32'] / 2**20:.1f} MiB at batch {first['value']}" in page
    assert f"({gain:.2f}x, measured)" in page and "<td>max_batch_size=32</td>" in page and offline(page)


def test_a_failed_sweep_reports_its_error_and_no_sentence_its_one_value_cannot_hold(tmp_path):
    db = tmp_path / "r.sqlite"
    point = json.loads(SWEEP.read_text())["points"][0]
    save(db, SweepResult(plan=SweepPlan("hf_max_batch_size", (4, 8), LoadConfig(users=(32,))), points=[point],
                         model="m", id="failedsweep1", status=RunStatus.FAILED, error="EngineFault: hf died"))
    page = write_report("failedsweep1", tmp_path / "r.html", db).read_text()
    assert "<td>failed (EngineFault: hf died)</td>" in page and "MiB at batch" not in page
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


def test_values_read_as_a_reader_expects_them():
    assert [cell(v) for v in (3975.4, 17.06, 0.0086374, 2.0, 23040, 2048, None, float("nan"), True, [])] == [
        "3,975", "17.1", "0.00864", "2", "23,040", "2048", "—", "—", "yes", "none"]
    assert cell(1073741824, "kv_cache_memory_bytes") == "1 GiB" and cell(25276502016, "total_bytes") == "23.5 GiB"
    assert cell([None, None]) == "—" and cell({"a": 1.23456, "b": None}, none="not set") == "a: 1.23; b: not set"
    said = prose(["- At 1 user: **2x**.\n- At 4 users: 3x.\n\nMore on the **Why** tab.", "", "One more."])
    assert said == ("<ul><li>At 1 user: <b>2x</b>.</li><li>At 4 users: 3x.</li></ul>"
                    "<p>More on the <b>Why</b> tab.</p><p>One more.</p>")


def cancelled_run(folder: Path) -> dict:
    """A run on fake engines cancelled while vLLM's 2-user level had finished no request; its summary.json."""
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm", token_delay_s=0.05)}
    result = fake_result(RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 2), requests_per_user=2,
                                                                         output_len=4, warmup_requests=0)), engines)

    async def cancel_in_the_last_level():
        task = asyncio.ensure_future(execute(result.plan, engines, CharTokenizer(), result))
        while not any(level.engine == "vllm" and level.users == 2 and level.in_flight() for level in result.levels):
            await asyncio.sleep(0.005)
        task.cancel()  # its requests are in flight: none can finish before the cancel lands (no await between)
        await task

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("lab.runs.SETTLE_S", 0)  # no vLLM pool to let go of between fake engines
        asyncio.run(cancel_in_the_last_level())
    write_run(result, folder)
    return json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def cancelled(tmp_path_factory):
    """A cancelled run's folder, its summary and its report."""
    folder = tmp_path_factory.mktemp("cancelled")
    summary = cancelled_run(folder)
    return folder, summary, write_report(str(folder), folder / "r.html").read_text()


def visible(page: str) -> str:
    """The page's text as a reader sees it (no scripts, styles or tags)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)))


def test_a_cancelled_level_shows_a_dash_and_says_why_never_nan_or_a_zero(cancelled):
    _, summary, page = cancelled
    (idle,) = [r for r in summary["runs"] if not r["completed"]]
    assert (idle["engine"], idle["users"], idle["status"]) == ("vllm", 2, "cancelled")
    row = re.search(r"<tr><td>vllm</td><td class='num'>2</td>.*?</tr>", page).group(0)
    assert row.count(">—</td>") == 10  # out tok/s and the nine percentiles: not measured, not 0
    assert "— : not measured: vLLM at 2 users (cancelled) finished no request" in page
    assert "NaN" not in visible(page) and "<td>cancelled</td>" in page


def test_a_report_leaves_out_a_panel_or_figure_with_nothing_to_draw(cancelled, tmp_path):
    figures_drawn = figures(cancelled[2])
    assert len(figures_drawn) == 3 and EMPTY not in cancelled[2]  # tok/s, ratio, lengths; no turns
    data = json.loads(WASTE.read_text())  # recorded before the waste figure's right panel (kinds_pct) existed
    assert all("kinds_pct" not in data[engine] for engine in ("hf", "vllm"))
    db = tmp_path / "r.sqlite"
    store_experiment(db, WASTE)
    page = write_report(data["experiment_id"], tmp_path / "w.html", db).read_text()
    assert "xaxis2" not in page and "what the held KV held" not in page and '"domain":[0,1]' in page.replace(" ", "")
    folder = tmp_path / "no-requests"
    shutil.copytree(cancelled[0], folder)
    (folder / "requests.csv").write_text("")
    assert "Request lengths" not in write_report(str(folder), folder / "r.html").read_text()


def with_predictions(data: dict, kind: str, answers: list, task_id: str) -> dict:
    """``data`` with a round of the room's predictions kept as the lab keeps it (lab.predictions.Round.stored)."""
    found = new_round(kind, "cuda")
    for page, answer in enumerate(answers):
        found.answer(str(page), found.choices[answer] if kind == "step" else answer)
    found.attach(task_id)
    found.measure(data)
    return data | {"predictions": found.stored()}


def test_a_report_shows_the_rooms_predictions_against_what_the_run_measured(tmp_path, report):
    shutil.copytree(CHAT, tmp_path / "run")
    summary = json.loads((CHAT / "summary.json").read_text())
    kept = with_predictions(summary, "ratio", ["3", "8x", 12, "20"], summary["run_id"])
    (tmp_path / "run" / "summary.json").write_text(json.dumps(kept))
    page = write_report(str(tmp_path / "run"), tmp_path / "r.html").read_text()
    view = kept["predictions"] | {"task_id": summary["run_id"], "ended": True}
    assert f"<p>{html.escape(room_sentence(view))}</p>" in page and "the room underestimated" in page
    assert sum(sum(t["y"]) for t in figures(page)[0] if t["name"] == "predictions") == 4
    assert "<td>10x</td><td>3.0x</td><td>20x</td><td>15x</td>" in page  # median, lowest, highest, measured
    assert "The room's predictions" not in report.read_text()  # a run that kept none shows none


def pages(folder: Path) -> dict[str, Path]:
    """One report of every kind, as the lab writes them: runs (recorded, with predictions; cancelled), an
    experiment, a why ladder (three levels, with predictions), a sweep and a capacity search."""
    db = folder / "r.sqlite"
    shutil.copytree(CHAT, folder / "run")
    summary = json.loads((CHAT / "summary.json").read_text())
    (folder / "run" / "summary.json").write_text(json.dumps(with_predictions(summary, "ratio", [4, 9, 30],
                                                                             summary["run_id"])))
    (folder / "ladder").mkdir()
    ladder = json.loads(LADDER.read_text())
    (folder / "ladder" / "explain.json").write_text(json.dumps(with_predictions(ladder, "step", [0, 4, 4],
                                                                                ladder["experiment_id"])))
    cancelled_run(folder / "cancelled")
    sources = {"run": folder / "run", "cancelled run": folder / "cancelled", "ladder": folder / "ladder",
               "experiment": store_experiment(db, WASTE)["experiment_id"], "capacity": CAPACITY,
               "sweep": store_sweep(db, SWEEP)["sweep_id"], "one-level ladder": EXPLAIN.parent}
    return {kind: write_report(str(source), folder / f"{kind}.html", db) for kind, source in sources.items()}


READ = """() => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const empty = plots.flatMap(gd => [...gd.querySelectorAll('.cartesianlayer .subplot')]
    .filter(panel => ![...panel.querySelectorAll('.overplot .trace path, .overplot .hm image')]
      .some(mark => mark.tagName === 'image' || !['', 'M0,0Z'].includes(mark.getAttribute('d') || '')))
    .map(panel => `${gd.layout.title.text}: ${panel.getAttribute('class')}`));
  const body = document.body.cloneNode(true);
  body.querySelectorAll('script, style').forEach(e => e.remove());
  const prose = body.cloneNode(true);
  prose.querySelectorAll('code').forEach(e => e.remove());
  return {figures: document.querySelectorAll('.fig').length, drawn: plots.length, empty, text: body.textContent,
          prose: prose.textContent};
}"""


@pytest.mark.ui
def test_every_kind_of_report_reads_in_chromium_offline_with_no_raw_json_nan_or_empty_panel(tmp_path):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run `make setup-dev`")
    written, attempted, seen = pages(tmp_path), [], {}

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
        for kind, path in written.items():
            page.goto(path.as_uri())
            page.wait_for_function("[...document.querySelectorAll('.fig')].every(f => f.querySelector("
                                   "'.js-plotly-plot .main-svg'))", timeout=30_000)
            seen[kind] = page.evaluate(READ)
        browser.close()
    assert attempted == []
    for kind, read in seen.items():
        assert written[kind].stat().st_size < MAX_BYTES, kind
        assert read["figures"] == read["drawn"] > 0 and read["empty"] == [], (kind, read["empty"])
        assert not re.search(r'\{\s*"[^"]*"\s*:', read["prose"]), kind  # no JSON object outside a command line
        assert "NaN" not in read["text"] and "nan" not in read["text"].split(), kind
        assert not any(words in read["text"] for words in (EMPTY, *EMPTY_WORDS.values())), kind
    assert "The room's predictions" in seen["run"]["text"] and "The room's predictions" in seen["ladder"]["text"]
    assert "finished no request" in seen["cancelled run"]["text"]
