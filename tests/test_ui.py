"""The dashboard: its agreement text (pure, fast), then the real app with the real engines (CPU) through
gradio_client and in headless Chromium (marked ui): the Load test tab, the Results and Environment tabs, the
workshop room and the API's refusals. The other tabs are tests/test_ui_tabs.py's; the fixtures and waits both use
are tests/ui_kit.py's."""

import json
import os
import time
from pathlib import Path

import pytest

from lab.agreement import Agreement, AgreementReport, compare, skipped
from lab.app.access import Access
from lab.app.dashboard import BOUND_REQUESTS, agreement_markdown, agreement_warning
from lab.config import EngineConfig
from lab.runs import summary_dict
from lab.store import list_runs
from tests.ui_kit import client, free_port, open_ready, sign_in, submit, typed, wait_text, wait_until, watching

PLOTS = ["plot-throughput", "plot-bars", "plot-ratio", "plot-queue", "plot-vllm-kv", "plot-kv-tokens"]


def chars(text):
    return [ord(c) for c in text]


def decode(ids):
    return "".join(chr(i) for i in ids)


def agreement(*pairs):
    """A dict shaped like LabHost.agreement() from Agreement pairs."""
    report = AgreementReport(list(pairs))
    return {"ok": report.ok, "verdicts": report.verdicts(), "pairs": report.to_dict()}


def pair(*answers):
    """vllm against hf over (prompt, hf's answer, vllm's answer) triples, one character per token."""
    prompts = tuple(compare(prompt, chars(ref), chars(other), decode) for prompt, ref, other in answers)
    return Agreement("hf", "vllm", prompts)


AGREE = pair(("Capital of France?", "Paris is the capital.", "Paris is the capital!"),
             ("Spider legs?", "Eight.", "Eight."))
DISAGREE = pair(("Capital of France?", "Paris | Lyon", "\n*zz*"))


def test_agreement_markdown_shows_each_verdict_and_a_row_per_prompt():
    text = agreement_markdown(agreement(AGREE))
    checked = agreement(AGREE)
    assert checked["verdicts"][0].startswith("vllm and hf agree: 26/27 greedy tokens identical over 2 prompts")
    assert f"- {checked['verdicts'][0]}" in text
    assert "**vllm against hf**, prompt by prompt (a divergence before token 8 is marked *early*):" in text
    assert "| prompt | identical tokens | first divergence (hf vs vllm) | hf says | vllm says |" in text
    assert ("| Capital of France? | 20/21 | token 20: `'.'` vs `'!'` | Paris is the capital. "
            "| Paris is the capital! |") in text
    assert "| Spider legs? | 6/6 | none | Eight. | Eight. |" in text


def test_agreement_markdown_flags_an_early_divergence_and_keeps_the_table_intact():
    text = agreement_markdown(agreement(DISAGREE))
    assert text.startswith("- WARNING: vllm and hf compute different text")
    row = next(line for line in text.splitlines() if line.startswith("| Capital"))
    assert "token 0: `'P'` vs `'\\n'` **(early)**" in row
    assert "Paris \\| Lyon" in row and "↵ \\*zz\\*" in row  # pipes and markup escaped, newlines shown
    assert row.replace("\\|", "").count("|") == 6


def test_agreement_markdown_before_the_check_and_when_skipped():
    assert agreement_markdown(None).startswith("Not checked")
    text = agreement_markdown(agreement(skipped("hf", "vllm", "skipped: random weights")))
    assert text == "- Agreement check skipped: random weights."


def test_agreement_warning_only_when_the_engines_disagree():
    assert agreement_warning(agreement(DISAGREE)) == (
        "**Warning:** vLLM and HF compute different text from the same model, so their speeds compare "
        "different computations: see the Environment tab.")
    assert agreement_warning(agreement(AGREE)) == ""
    assert agreement_warning(agreement(skipped("hf", "vllm", "skipped"))) == ""
    assert agreement_warning(None) == ""


def test_a_redraw_is_built_once_per_change_and_shared_by_every_page():
    import gradio as gr
    import plotly.graph_objects as go
    from gradio.components.plot import PlotData

    from lab.app.ui_timer import Shared

    version, builds = [0], []

    def redraw():
        builds.append(version[0])
        return [f"v{version[0]}", go.Figure(go.Scatter(y=[1, version[0]])), gr.update(value="x", visible=True)]

    shared = Shared(lambda: version[0], redraw, rebuild_s=0.2)
    pages = [shared() for _ in range(50)]
    assert builds == [0] and all(isinstance(p[1], PlotData) for p in pages)  # the figure's JSON, made once
    pages[0][2].pop("value")  # as Gradio does when it sends an update to one page
    assert shared()[2]["value"] == "x" and pages[1][2] is not pages[0][2]
    version[0] = 1  # a run moves the key several times a second: the ticks see the last build's key a while
    assert shared.key_now() == 0 and shared()[0] == "v0" and builds == [0]
    time.sleep(0.25)
    assert shared.key_now() == 1 and shared()[0] == "v1" and shared()[0] == "v1" and builds == [0, 1]


def test_a_shared_redraw_never_hands_a_page_a_build_older_than_the_key_its_tick_read():
    """Two pages, the key moving from 0 to 1 at a run's end: page A's redraw built key 0 (it read the key just
    before the move) while page B's tick, once the last build had aged, read 1. B is handed a build at 1, not A's
    younger one at 0: B's later ticks read 1 again, so a build at 0 would stay on its page (a cancelled run drawn as
    running, 2026-11-30)."""
    from lab.app.ui_timer import Shared

    version, builds = [1], []

    def redraw():
        builds.append(version[0])
        return [f"v{version[0]}"]

    shared = Shared(lambda: version[0], redraw, rebuild_s=60)
    shared._built = (0, ["v0"], time.monotonic())  # page A's build, just made at key 0
    assert shared(0) == ["v0"] and builds == []  # a page whose tick read 0 may have it while it is young
    assert shared(1) == ["v1"] and builds == [1]  # page B, whose tick read 1, gets a build at 1
    assert shared(1) == ["v1"] and shared() == ["v1"] and builds == [1]  # built once for every page after


def test_a_room_past_its_tick_budget_slows_every_page_alike_and_a_page_that_left_stops_counting(monkeypatch):
    import gradio as gr

    from lab.app import ui_timer
    from lab.app.ui_timer import SLOWEST_TICK_S, Pace

    pace, now, has = Pace(1.0, budget=10), [0.0], {}
    monkeypatch.setattr(ui_timer.time, "monotonic", lambda: now[0])
    assert [pace.interval(n) for n in (1, 10, 11, 20, 21, 50, 500)] == [1, 1, 2, 2, 3, 5, SLOWEST_TICK_S]
    assert Pace(0.5, budget=10).interval(20) == 2  # 10 ticks a second, whatever the page's own tick

    def tick(page, pace=pace):  # a page keeps the interval it is told, as a browser's timer does
        told = pace.ticked(page, has.setdefault(page, 1.0))
        has[page] = told.value if isinstance(told, gr.Timer) else has[page]
        return told

    assert all(tick(f"p{i}") == gr.skip() for i in range(10))  # ten pages tick every second
    assert tick("p10").value == 2  # the 11th page is told 2 s; the first ten learn it at their next tick
    assert tick("p0").value == 2 and tick("p0") == gr.skip()  # told once
    now[0] = 2 * SLOWEST_TICK_S - 1
    tick("p0")  # ten pages closed: p0 alone ticks on
    now[0] = 2 * SLOWEST_TICK_S + 0.5
    assert tick("p0").value == 1  # back to every second
    has["tab"], now[0] = 5.0, 100.0  # a background tab told 5 s, quiet for long: the room emptied meanwhile
    assert tick("tab").value == 1
    presenter = Pace(1.0, budget=1, steady=lambda session: session == "presenter")
    assert tick("a", presenter) == gr.skip() and tick("b", presenter).value == 2
    assert tick("presenter", presenter) == gr.skip() and tick("a", presenter).value == 3  # counted, not slowed


def test_the_server_counts_the_cores_its_container_may_use(monkeypatch, tmp_path):
    from lab.app import ui_timer

    monkeypatch.setattr(ui_timer.os, "sched_getaffinity", lambda pid: set(range(16)))
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(ui_timer, "Path", lambda where: quota)  # the only path it reads
    quota.write_text("200000 100000\n")
    assert ui_timer.server_cores() == 2.0  # a quota of 2 cores on a 16-core host
    quota.write_text("max 100000\n")
    assert ui_timer.server_cores() == 16.0


def shown_by_id(config: dict) -> dict:
    """The props a served config gives each component with an elem_id, by that id."""
    return {c["props"]["elem_id"]: c["props"] for c in config["components"] if c["props"].get("elem_id")}


def test_a_pages_first_frame_carries_the_last_run_and_ladder_and_what_an_unsigned_page_may_press(tmp_path):
    """The config the app serves a page (lab.app.ui_frame), with no engine loaded: the newest stored run's form,
    progress line and estimate, the newest stored ladder and the stored ladders; every page's controls in an open app,
    and in a room an unsigned page's disabled with the note beside them."""
    from lab.app.host import LabHost
    from lab.app.ui import build_app
    from lab.store import list_experiments, save
    from tests.conftest import CharTokenizer
    from tests.test_report import EXPLAIN, store_experiment
    from tests.test_store import finished_run

    db = tmp_path / "r.sqlite"
    store_experiment(db, EXPLAIN)
    ladder, run = list_experiments(db, "why")[0], finished_run(CharTokenizer())
    save(db, run)
    host = LabHost(EngineConfig(device="cpu", max_model_len=1024), db_path=db)
    host.status.ready = True  # nothing loaded: what the page reads is the store's and the rule's
    access = Access.for_app("127.0.0.1", environ={})
    try:
        app = build_app(host, access)
        shown = shown_by_id(app.config)
        assert (shown["users"]["value"], shown["output-len"]["value"]) == ("1,2", 4)
        assert run.id in shown["progress"]["value"] and "Estimated time: about" in shown["estimate"]["value"]
        assert f"({ladder['experiment_id']}, {ladder['status']}" in shown["why-progress"]["value"]
        assert [value for _, value in shown["why-stored"]["choices"]] == [ladder["experiment_id"]]
        assert shown["run"]["interactive"] and not shown["run-watch"]["visible"]
        assert not shown["sign-in-box"]["visible"] and shown["role"]["value"] == ""
        access.token = "workshop-token-25"  # a room: a page not signed in watches
        shown = shown_by_id(app.config)
        assert not any(shown[button]["interactive"] for button in ("run", "demo", "why-run", "sweep-run", "connect"))
        assert "**Presenter only:** Run and Cancel" in shown["run-watch"]["value"] and shown["run-watch"]["visible"]
        assert "Watching" in shown["role"]["value"] and shown["sign-in-box"]["visible"]
    finally:
        host.runner.stop()


@pytest.mark.ui
def test_api_runs_and_reads_results_back(served):
    host, url = served
    c = client(url)
    summary = json.loads(c.predict("hf,vllm", "1,2", "mixed", 8, 1, 2, api_name="/run_and_wait"))  # 2 repeats
    assert summary["status"] == "ok"
    assert sorted((r["engine"], r["users"], r["repeat"]) for r in summary["runs"]) == sorted(
        (e, u, k) for e in ("hf", "vllm") for u in (1, 2) for k in (0, 1))
    assert all(r["output_tokens"] == 8 * r["users"] for r in summary["runs"])
    assert set(summary["ratio"]) == {"1", "2"} and summary["spread"]["ratio"]["2"]["n"] == 2
    lead, details, _ = c.predict(api_name="/load_runs")
    stored = {row[0]: dict(zip(details["headers"], row, strict=True)) for row in details["data"]}
    assert summary["run_id"] in stored and stored[summary["run_id"]]["repeats"] == 2
    row = dict(zip(lead["headers"], lead["data"][0], strict=True))  # the newest first
    assert row["vLLM/HF"] == round(summary["ratio"]["2"], 2) and isinstance(row["HF tok/s"], float)  # numbers
    assert "run_id" not in row and row["when"] == stored[summary["run_id"]]["when"]  # the id in the details
    *_, csv_path, json_path, report_path = c.predict([summary["run_id"]], api_name="/compare")
    assert len(Path(csv_path).read_text().splitlines()) == 1 + 12
    assert json.loads(Path(json_path).read_text())["run_id"] == summary["run_id"]
    assert summary["run_id"] in Path(report_path).read_text()  # the Download report button's file
    error = json.loads(c.predict("hf", "0", "mixed", 8, 1, api_name="/run_and_wait"))
    assert ">= 1" in error["error"]


@pytest.mark.ui
def test_the_results_tab_downloads_a_stored_runs_report(served, browser, tmp_path):
    """Choose a stored run (the API test's) in the Results tab and press Download report: the HTML file comes."""
    host, url = served
    run_id = list_runs(host.db_path)[0]["run_id"]
    page = open_ready(browser, url)
    page.get_by_role("tab", name="Results").click()
    page.get_by_label("Runs to compare (the first is downloadable)").fill(run_id)
    page.keyboard.press("Enter")
    wait_text(page, "#compare-args", "vllm", 60)
    with page.expect_download(timeout=60_000) as download:
        page.click("#download-report")
    saved = tmp_path / "report.html"
    download.value.save_as(saved)
    page.close()
    assert saved.read_text().count(run_id) >= 2 and "plotly" in saved.read_text()


@pytest.mark.ui
def test_environment_tab_shows_the_agreement_check(served, browser):
    host, url = served
    checked = host.agreement()
    assert checked is not None and checked["pairs"], "two engines loaded: the check ran"
    page = open_ready(browser, url)
    warning = page.inner_text("#agreement-warning")
    assert ("different text" in warning) == (checked["ok"] is False), warning
    page.get_by_role("tab", name="Environment").click()
    wait_text(page, "#environment", "Do the engines agree?", 30)
    text = page.inner_text("#environment")
    for verdict in checked["verdicts"]:
        assert verdict.split(":")[0] in text  # "vllm and hf agree", or the warning, or why it was skipped
    assert "agree" in text.split("Do the engines agree?")[1]
    if checked["pairs"][0]["prompts"]:
        assert "What is the capital of France?" in text and "identical tokens" in text
    page.close()


NO_MADE_UP_AXES = """() => {
    const bad = [];
    for (const e of document.querySelectorAll('[id^="plot-"]')) {
        const ticks = [...e.querySelectorAll('.xtick text, .ytick text')].map(t => t.textContent);
        if (ticks.some(t => /^[\u2212-]/.test(t))) bad.push(`${e.id}: negative ticks ${ticks.join(' ')}`);
        if (e.innerText.includes('None')) bad.push(`${e.id}: None`);
    }
    return bad;
}"""
WORDS_BROKEN = """(selector) => {
    const broken = [];
    for (const cell of document.querySelectorAll(`${selector} th, ${selector} td`)) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (const m of node.textContent.matchAll(/\S+/g)) {
                const range = document.createRange();
                range.setStart(node, m.index);
                range.setEnd(node, m.index + m[0].length);
                const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
                if (lines.size > 1) broken.push(m[0]);
            }
        }
    }
    return broken;
}"""
COLUMNS_IN_VIEW = """(names) => {
    const box = document.querySelector('#runs-table').getBoundingClientRect();
    const right = Math.min(box.right, window.innerWidth) + 1;
    return [...document.querySelectorAll('#runs-table th')]
        .map(th => [th.innerText.trim(), th.getBoundingClientRect()]).filter(([name]) => names.includes(name))
        .map(([name, r]) => [name, r.left >= box.left - 1 && r.right <= right]);
}"""


def watch_while_running(page, host, run_id):
    """While the run goes: a busy spinner, and no plot with negative axes or 'None' (sampled once a second)."""
    page.wait_for_selector("#busy .kv-spin", timeout=30_000)
    seen = []
    while host.last("run").id == run_id and host.last("run").status == "running":
        seen += page.evaluate(NO_MADE_UP_AXES)
        time.sleep(1)
    assert not seen, seen


def check_results_table(page):
    """tok/s and ratio columns inside the viewport without scrolling; no word broken in a header or cell."""
    page.get_by_role("tab", name="Results").click()
    page.wait_for_selector("#runs-table th", timeout=20_000)
    found = dict(page.evaluate(COLUMNS_IN_VIEW, ["HF tok/s", "vLLM tok/s", "vLLM/HF"]))
    assert found == {"HF tok/s": True, "vLLM tok/s": True, "vLLM/HF": True}, found
    assert page.evaluate(WORDS_BROKEN, "#runs-table") == []
    page.get_by_role("tab", name="Load test").click()


@pytest.mark.ui
def test_workshop_demo_fills_the_form_and_draws_both_engines(served, browser, tmp_path):
    from lab.presets import workshop_demo

    host, url = served
    preset = workshop_demo(host.config)
    page = open_ready(browser, url, viewport={"width": 1400, "height": 900})
    assert "bench.workshop_demo" in page.inner_text("#demo-why")  # how the preset was chosen
    wait_text(page, "#estimate", "Estimated time: about", 20)  # before every Run
    page.click("#demo")
    wait_text(page, "#message", "started", 30)
    assert page.input_value("#users textarea") == preset.users
    assert host.last("run").plan == preset.plan(host.config)
    run_id = host.last("run").id  # the demo's run (checked just above); the message line may have moved on
    watch_while_running(page, host, run_id)
    try:
        wait_text(page, "#progress", f"Run {run_id} done: ", 300)
    except Exception as exc:  # say where the run stood (a run that hung once here must be found)
        result = host.last("run")
        levels = [(lvl.engine, lvl.users, lvl.status, len(lvl.records), len(lvl.in_flight())) for lvl in result.levels]
        raise AssertionError(f"progress: {page.inner_text('#progress')!r}; message {page.inner_text('#message')!r}; "
                             f"run {result.id} {result.status} "
                             f"{result.message!r}; levels {levels}; running {host.running()}") from exc
    time.sleep(1.5)  # one more timer tick draws the final figures
    assert host.last("run").estimate_s > 0 and host.wait_task(10).ended_s  # the estimate it was given, kept
    for plot in PLOTS:
        assert page.eval_on_selector(f"#{plot}", "e => e.querySelectorAll('g.trace').length") >= 1, plot
    for plot in ("plot-throughput", "plot-bars", "plot-queue"):
        text = page.inner_text(f"#{plot}")
        assert "HF" in text and "vLLM" in text, plot
    ratio_text = page.inner_text("#plot-ratio")
    assert ratio_text.count("x\n") >= 2 or ratio_text.count("x") >= 2
    assert "noisy" not in ratio_text and "x*" not in ratio_text  # no level starred: enough requests at each
    assert "blocks x 128 tokens" in page.inner_text("#plot-vllm-kv")
    kv_text = page.inner_text("#plot-kv-tokens")
    assert "HF: held" in kv_text and "vLLM: held" in kv_text  # both engines on one axis
    table = page.inner_text("#latency")
    assert "hf" in table and "vllm" in table
    assert page.evaluate(WORDS_BROKEN, "#latency") == []
    caption = page.inner_text("#ratio-caption")  # each level's ratio taken apart into its steps, and the floor
    for users in host.last("run").plan.load.users:
        level = summary_dict(host.last("run"))["factors"][str(users)]
        assert f"At {users} users, vLLM/HF {level['product']:.2f}x = " in caption
    assert "tokens per step" in caption and "its floor" in caption
    wait_text(page, "#estimate", "stored run", 20)  # right after the run: what it taught, no edit needed
    assert not page.query_selector("#busy .kv-spin")
    shot = Path(os.environ.get("KVLAB_SCREENSHOT", tmp_path / "dashboard.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    check_results_table(page)
    page.close()


@pytest.mark.ui
def test_a_page_opened_after_a_run_shows_its_settings_plots_and_estimate_at_1280x720(served, browser, tmp_path):
    """A page opened as a run ends shows it in its first frame: no queued event answered (no tick, no load event),
    the form holds the run's settings, and the estimate, the progress line, the ratio and the stored runs are there;
    then, at 1280x720, Run and the story above the fold."""
    host, url = served
    summary = json.loads(client(url).predict("hf,vllm", "2", "mixed", 6, 1, api_name="/run_and_wait"))
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    held = []
    page.route("**/queue/join*", lambda route: held.append(route))  # the page's queued events wait: what shows is
    page.goto(url)  #                                                  what its first frame carried
    page.wait_for_selector("#users textarea")
    assert (page.input_value("#users textarea"), page.input_value("#output-len input")) == ("2", "6")
    assert summary["run_id"] in page.inner_text("#progress") and "Estimated time: about" in page.inner_text("#estimate")
    page.wait_for_function("() => document.querySelectorAll('#plot-ratio g.trace').length > 0", timeout=20_000)
    page.get_by_role("tab", name="Results").click()
    when = next(row["when"] for row in list_runs(host.db_path) if row["run_id"] == summary["run_id"])
    assert when in page.inner_text("#runs-table") and held  # the stored runs listed; nothing queued answered yet
    page.get_by_role("tab", name="Load test").click()
    page.unroute("**/queue/join*")  # the held events go on
    for selector in ("#run", "#plot-ratio", "#plot-bars"):  # a laptop's first screen: Run and the story
        assert page.eval_on_selector(selector, "e => e.getBoundingClientRect().bottom") <= 720, selector
    small = Path(os.environ.get("KVLAB_SCREENSHOT_1280", tmp_path / "dashboard-1280x720.png"))
    page.screenshot(path=str(small))
    assert small.stat().st_size > 10_000
    check_results_table(page)
    page.close()


@pytest.fixture(scope="class")
def form(served, browser):
    """One page for a class of refusals (a new page costs ~4 s on 2 cores); each test sets the user levels it
    needs, puts back every other field it typed into, and leaves its error gone from the message line."""
    page = open_ready(browser, served[1])
    yield page
    page.close()


FORM_LINES = ["#estimate", "#message"]  # what a refusal test's time-out reports


def clear_error(page) -> None:
    """A changed form: the refusal is stale and leaves the message line."""
    page.fill("#users textarea", "1,2")
    wait_until(page, "() => !document.querySelector('#message').innerText.includes('Input error')", 10, FORM_LINES)


@pytest.mark.ui
class TestRefusalsOnOnePage:
    @pytest.mark.parametrize("users, output_len, expected", [
        ("", 0, "at least one user level"),
        ("0", 0, ">= 1"),
        ("5,-2", 0, ">= 1"),
        ("1", 5000, "max_model_len 1024"),
        ("1,100000", 0, "100000 is past the limit of 256"),
    ])
    def test_bad_input_shows_a_message_and_the_app_keeps_serving(self, served, form, users, output_len, expected):
        host, url = served
        kept = form.input_value("#output-len input")
        submit(form, users, output_len)
        wait_text(form, "#message", expected, 20)
        assert "Input error" in form.inner_text("#message")
        # said once: the estimate line goes empty (waited for: Gradio may draw a moment's "0.0s" timer over it while
        # the form's twenty change events settle, though each of them hides its progress)
        wait_until(form, "() => document.querySelector('#estimate').innerText.trim() === ''", 10, FORM_LINES)
        assert not host.running()
        assert client(url).predict(api_name="/cancel") == "No run in progress."
        form.fill("#output-len input", kept)
        clear_error(form)

    @pytest.mark.parametrize("fields, expected", [
        ({"bound": "seconds per level", "#amount input": "100000"}, "at most 3600 (an hour), not 100000"),
        ({"#repeats input": "0"}, "Repeats: give a whole number from 1 to 10, not 0"),
        ({"#repeats input": "1.5"}, "Repeats: give a whole number from 1 to 10, not 1.5"),
        ({"#output-len input": ""}, "Output length (0 = the workload's): give a whole number"),
        ({"#rate input": "-3"}, "give 0 for a closed loop"),
    ])
    def test_every_bad_field_shows_the_labs_message_and_starts_nothing(self, served, form, fields, expected, capfd):
        host, url = served
        stored = len(list_runs(host.db_path))
        form.fill("#users textarea", "1")
        if not form.is_visible("#rate input"):
            form.click("#more-options")  # open loop and SLO are folded away
        kept = {selector: form.input_value(selector) for selector in fields if selector != "bound"}
        for selector, value in fields.items():
            form.get_by_label(value).check() if selector == "bound" else form.fill(selector, value)
        form.click("#run")
        wait_text(form, "#message", expected, 20)
        assert form.inner_text("body").count(expected) == 1  # once, under Run: the estimate line stays empty
        assert "Input error" in form.inner_text("#message") and "less than minimum" not in form.content()
        assert not host.running() and len(list_runs(host.db_path)) == stored
        if "bound" in fields:
            form.get_by_role("radio", name=BOUND_REQUESTS).check()
        for selector, value in kept.items():
            form.fill(selector, value)
        clear_error(form)
        assert "Traceback" not in "".join(capfd.readouterr())  # the app's log: a refusal, never an exception


@pytest.mark.ui
def test_second_browser_watches_and_cancel_keeps_partial_results(served, browser):
    host, url = served
    first = open_ready(browser, url)
    submit(first, "4", 64, 5)
    wait_text(first, "#message", "started", 30)
    second = open_ready(browser, url)  # a late-comer: its form shows the running run's settings
    wait_text(second, "#progress", "Running", 30)
    second.wait_for_function("() => document.querySelector('#users textarea').value === '4'", timeout=10_000)
    assert second.input_value("#output-len input") == "64"
    second.wait_for_selector("#cancel:enabled", timeout=10_000)  # Cancel is there to stop it; nothing to press twice
    assert second.is_disabled("#run") and second.is_disabled("#demo")
    assert "already in progress" in client(url).predict(["vllm"], "1", "mixed", 8, BOUND_REQUESTS, 1, 1,
                                                           api_name="/start_run")
    while not any(r.status == "ok" for lvl in host.last("run").levels for r in lvl.records):
        time.sleep(0.2)
    clicked = time.monotonic()
    second.click("#cancel")
    wait_text(first, "#progress", "cancelled", 30)
    assert host.wait_task(10).status == "cancelled"
    assert time.monotonic() - clicked < 10  # stops within about two seconds (+ the page's 1 s timer); 7.2 s once
    #                                        on a loaded 2-core machine (2026-11-29), so the bound leaves room
    wait_text(second, "#message", f"Run {host.last('run').id} ended: cancelled", 10)  # no 'Cancelling' left
    second.wait_for_selector("#run:enabled", timeout=10_000)
    assert second.is_disabled("#cancel")
    finished = sum(1 for lvl in host.last("run").levels for r in lvl.records if r.status == "ok")
    assert f"{finished} requests finished" in first.inner_text("#progress")
    wait_text(first, "#latency", "vllm" if host.last("run").levels[-1].engine == "vllm" else "hf", 10)
    _, details, _ = client(url).predict(api_name="/load_runs")
    stored = {row[0]: row for row in details["data"]}
    assert host.last("run").id in stored and "cancelled" in stored[host.last("run").id]
    first.close()
    second.close()


@pytest.mark.ui
def test_a_page_in_the_browser_ticks_at_the_pace_its_tick_answer_sets(browser):
    import gradio as gr

    from lab.app.ui_timer import Pace, Ticker

    ticks: dict[str, list[float]] = {}

    class Counted(Pace):
        def ticked(self, session, has):
            ticks.setdefault(session, []).append(time.monotonic())
            return super().ticked(session, has)

    with gr.Blocks() as app:
        shown = gr.Markdown()
        ticker = Ticker(1.0, {"show_progress": "hidden"}, Counted(1.0, budget=1))  # a room of 1 page a second
        ticker.add([(lambda: 0, lambda: "drawn", [shown])])
        ticker.wire()
    port = free_port()
    app.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        pages = [browser.new_page() for _ in range(2)]
        for page in pages:
            page.goto(f"http://127.0.0.1:{port}/")
        time.sleep(10)
        assert len(ticks) == 2
        for times in ticks.values():  # two pages: each told 2 s at its first tick after the second came
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)][-3:]
            assert len(gaps) == 3 and all(1.7 < gap < 2.7 for gap in gaps), gaps
        for page in pages:
            page.close()
    finally:
        app.close()


@pytest.mark.ui
def test_an_attendee_cannot_start_cancel_restart_or_connect_and_the_presenter_can(served, browser, room):
    """An attendee's page shows every presenter's control disabled, the reason beside it (nothing to press and be
    refused); the API still refuses a call without the token. The presenter's page hides the sign-in once signed
    in, and its Cancel is pressable as its run is accepted."""
    from gradio_client import Client

    host, url = served
    attendee = open_ready(browser, url)
    wait_text(attendee, "#role", "Watching", 20)
    wait_text(attendee, "#run-watch", "Presenter only: Run and Cancel", 20)
    assert attendee.is_disabled("#run") and attendee.is_disabled("#cancel") and attendee.is_disabled("#demo")
    assert "Presenter only: Workshop demo" in attendee.inner_text("#demo-watch")
    attendee.click("text=Add an endpoint")
    wait_text(attendee, "#endpoint-status", "Presenter only: Connect", 20)
    assert attendee.is_disabled("#connect")
    for tab, prefix in (("KV cache", "kv"), ("Sweeps", "sweep"), ("Why", "why"), ("Capacity", "capacity")):
        attendee.get_by_role("tab", name=tab).click()  # every tab's controls follow the one rule
        watching(attendee, prefix, "Run sweep and Cancel" if prefix == "sweep" else "Run and Cancel")
    assert "Presenter only:** Starting a run" in client(url).predict(["hf"], "1", "mixed", 8, BOUND_REQUESTS, 1, 1,
                                                                      0, "", api_name="/start_run")
    assert not host.running()
    attendee.get_by_role("tab", name="Load test").click()
    presenter = open_ready(browser, f"{url}?token={room}")
    wait_text(presenter, "#role", "Presenter:", 20)
    assert "token=" not in presenter.url  # the page drops it from the address bar
    assert not presenter.is_visible("#sign-in-box") and not presenter.is_visible("#run-watch")
    submit(presenter, "4", 64, 5)
    wait_text(presenter, "#message", "started", 30)
    presenter.wait_for_selector("#cancel:enabled", timeout=10_000)
    wait_text(attendee, "#progress", "Running", 20)
    assert attendee.is_disabled("#cancel")  # the run goes; the attendee's Cancel stays the presenter's
    assert "Presenter only:** Cancelling" in client(url).predict(api_name="/cancel") and host.running()
    presenter.click("#cancel")
    assert host.wait_task(30).status == "cancelled"
    deadline = time.monotonic() + 10
    while host.running() and time.monotonic() < deadline:  # the cancelled run's task ends just after its result
        time.sleep(0.1)
    presenter.click("text=Add an endpoint")
    typed(presenter, "#endpoint-url textarea", "http://127.0.0.1:9")
    presenter.click("#connect")  # past the guard: the host tries it
    try:
        wait_text(presenter, "#endpoint-status", "nothing answers at http://127.0.0.1:9", 20)
    except Exception as exc:
        raise AssertionError(f"endpoint status: {presenter.inner_text('#endpoint-status')!r}") from exc
    assert "Presenter only:** Restarting engines" in client(url).predict(api_name="/restart")  # no token: refused
    with_token = Client(url, verbose=False, headers={"X-KVLab-Token": room})
    assert "nothing to restart" in with_token.predict(api_name="/restart")  # the presenter's call reaches the host
    attendee.click("text=Presenter sign-in")
    sign_in(attendee, "not-the-token", "Not signed in")
    sign_in(attendee, room, "Presenter:")
    attendee.wait_for_selector("#run:enabled", timeout=10_000)  # signed in: its controls, no notes, no sign-in
    assert not attendee.is_visible("#run-watch") and not attendee.is_visible("#sign-in-box")
    attendee.close()
    presenter.close()


@pytest.mark.ui
def test_two_attendees_predict_the_presenter_runs_and_every_page_shows_the_room_against_the_measured_ratio(
        served, browser, room):
    """Issue 43's acceptance: an attendee's Open is disabled with the reason beside it (and refused through the API);
    two attendees predict; the presenter's tiny run takes the round along; then all three pages draw the histogram
    and the measured ratio, and the run stores them."""
    from lab.predictions import times
    from lab.store import load_summary

    host, url = served
    presenter, *attendees = pages = [browser.new_page() for _ in range(3)]
    for page, link in zip(pages, (f"{url}?token={room}", url, url), strict=True):
        page.goto(link, wait_until="commit")  # the three load at once
    for page, role in zip(pages, ("Presenter:", "Watching", "Watching"), strict=True):
        wait_text(page, "#role", role, 60)
    for page in pages:
        page.get_by_role("tab", name="Predict").click()
        page.click("text=Presenter: open and close predictions")
    wait_text(attendees[0], "#predict-presenter-message", "Presenter only: Open and Close predictions", 20)
    assert attendees[0].is_disabled("#predict-open") and attendees[0].is_disabled("#predict-close")
    before = host.predictions()
    assert "Presenter only:** Opening predictions" in client(url).predict("ratio", api_name="/open_predictions")
    assert host.predictions() == before  # refused: nothing opened
    presenter.click("#predict-open")
    wait_text(presenter, "#predict-presenter-message", "Predictions open", 20)
    for page, guess in zip(attendees, ("2", "5"), strict=True):
        typed(page, "#predict-ratio input", guess)
        page.click("#predict-send")
        wait_text(page, "#predict-message", f"Your prediction: {guess}.0x", 20)
    wait_text(presenter, "#predict-status", "2 predictions so far", 20)
    presenter.get_by_role("tab", name="Load test").click()
    submit(presenter, "1", 8, 1)
    wait_text(presenter, "#message", "started", 30)
    run = host.wait_task(300)
    assert run.status == "ok"
    measured = load_summary(host.db_path, run.id)["predictions"]
    assert measured["values"] == [2.0, 5.0] and measured["measured"] and not measured["open"]
    presenter.get_by_role("tab", name="Predict").click()
    for page in pages:
        wait_text(page, "#predict-sentence", f"2 predictions, median 3.5x (from 2.0x to 5.0x); measured "
                                             f"{times(measured['measured'])}", 30)
        page.wait_for_function("() => document.querySelectorAll('#predict-figure g.trace').length > 0",
                               timeout=20_000)
        assert f"measured {times(measured['measured'])}" in page.inner_text("#predict-figure")
        page.close()


@pytest.mark.ui
def test_a_short_soak_prints_its_growth(served):
    from bench.soak import growth, report, soak
    from lab.config import LoadConfig, RunPlan

    host, _ = served
    plan = RunPlan(engines=("hf", "vllm"), engine=host.config,
                   load=LoadConfig(users=(1, 2), requests_per_user=1, output_len=8, warmup_requests=0))
    samples = soak(host, plan, runs=3)
    assert [s.status for s in samples] == ["ok"] * 3 and all(s.vllm_tok_s for s in samples)
    assert samples[-1].children >= 2 and samples[-1].fds > 0  # vLLM's engine core and worker were read
    text = report(samples, growth(samples))
    print(text)
    assert "lab_rss_mib" in text and "verdict:" in text


@pytest.mark.ui
def test_the_api_answers_bad_values_and_crafted_ids_with_the_pages_words(served):
    host, url = served
    c, stored = client(url), len(list_runs(host.db_path))
    for args, expected in [((8, 1, 1.5), "Repeats: give a whole number from 1 to 10, not 1.5"),
                           ((1.5, 1, 1), "Output length (0 = the workload's): give a whole number"),
                           ((8, 1, 1, -3), "give 0 for a closed loop")]:
        error = json.loads(c.predict("hf", "1", "mixed", *args, api_name="/run_and_wait"))
        assert expected in error["error"]
    for crafted in ("../x", "/etc/passwd", "' or 1=1 --"):
        with pytest.raises(Exception, match="no such run"):
            c.predict([crafted], api_name="/compare")
    assert not host.running() and len(list_runs(host.db_path)) == stored


@pytest.mark.ui
def test_unknown_names_through_the_api_get_the_labs_words(served):
    host, url = served
    c = client(url)
    answer = c.predict(["hf"], "1", "nope", 0, BOUND_REQUESTS, 1, 1, 0, "", api_name="/start_run")
    assert "unknown workload 'nope'" in answer
    assert "unknown knob 'nope'" in c.predict("nope", "1,2", "1", "mixed", 1, 0, api_name="/start_sweep")
    assert "unknown preset 'nope'" in c.predict("nope", 1, "hf,vllm", api_name="/start_ladder")
    assert "Repeats: give a whole number from 1 to 10, not 0" in c.predict(
        ["hf"], "1", "mixed", 0, BOUND_REQUESTS, 1, 0, 0, "", api_name="/start_run")
    assert not host.running()
