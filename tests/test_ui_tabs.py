"""The app's other tabs in headless Chromium on the real engines (CPU), marked ui: a killed vLLM and its restart, an
endpoint, then the KV cache, Sweeps, Why and Capacity tabs. A file of its own (its own served app), so
that CI runs it beside tests/test_ui.py, one process each."""

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest

from lab.__main__ import main
from lab.app.dashboard import BOUND_REQUESTS
from lab.config import EngineConfig
from lab.words import times
from tests.ui_kit import client, open_ready, open_tab, typed, wait_text, watching


@pytest.mark.ui
def test_a_killed_vllm_fails_its_run_shows_dead_and_restarts_from_the_page(served, browser, capsys):
    import signal

    import psutil

    host, url = served
    page = open_ready(browser, url)
    c = client(url)
    assert "started" in c.predict(["vllm"], "3", "decode", 64, BOUND_REQUESTS, 4, 1, api_name="/start_run")
    while not any(r.output_tokens for lvl in host.last("run").levels for r in lvl.sent):
        time.sleep(0.1)
    core = next(p for p in psutil.Process(host._pid).children() if "EngineCore" in " ".join(p.cmdline()))
    assert host._pid != os.getpid()  # vLLM's engine process: a child of the app's engine host process
    os.kill(core.pid, signal.SIGKILL)
    result = host.wait_task(60)
    assert result.status == "failed", result.message
    assert result.error == "vLLM's engine process exited (signal 9, SIGKILL), during the 3-user level of vllm"
    assert result.levels[-1].status == "failed" and result.levels[-1].records  # what it measured is kept
    _, details, _ = c.predict(api_name="/load_runs")
    assert {row[0]: row for row in details["data"]}[result.id][2] == "failed"
    wait_text(page, "#load-status", "vLLM dead", 20)
    assert "signal 9" in page.inner_text("#load-status")
    assert main(["env", "--app", url]) == 0  # the CLI asks the running app
    health = json.loads(capsys.readouterr().out)["health"]
    assert health["vllm"]["state"] == "dead" and "signal 9" in health["vllm"]["reason"]
    assert health["hf"]["state"] == "alive"
    page.wait_for_selector("#run:enabled", timeout=10_000)  # the page drew the run's end (its buttons may lag the
    #                        status line by a tick): the next Run disabled is the restart's
    page.click("#restart")
    wait_text(page, "#restart-message", "Restarting vLLM", 20)  # beside its button
    page.wait_for_selector("#run:disabled", timeout=10_000)  # the restart runs to its end: nothing to cancel
    assert page.is_disabled("#cancel")  # with Run: the engines are marked restarting as the restart starts
    wait_text(page, "#load-status", "Engines ready.", 240)
    assert host.health()["vllm"]["state"] == "alive" and host.health()["hf"]["state"] == "alive"
    summary = json.loads(c.predict("hf,vllm", "1", "mixed", 8, 1, api_name="/run_and_wait"))
    assert summary["status"] == "ok" and all(r["completed"] == 1 for r in summary["runs"])
    page.close()


@pytest.mark.ui
def test_an_endpoint_connects_from_the_page_and_runs_open_loop_beside_hf(served, browser):
    from lab.model import resolve_model
    from lab.serve import start_server, stop

    host, url = served
    server = start_server("hf", EngineConfig(device="cpu"), resolve_model(None))  # transformers serve
    try:
        page = open_ready(browser, url)
        page.click("text=Add an endpoint")
        typed(page, "#endpoint-url textarea", "http://127.0.0.1:9")
        page.click("#connect")
        wait_text(page, "#endpoint-status", "nothing answers at http://127.0.0.1:9", 20)  # refused, the app serves on
        typed(page, "#endpoint-url textarea", server.url)
        typed(page, "#endpoint-model textarea", server.model)
        page.click("#connect")
        wait_text(page, "#endpoint-status", "Connected openai", 60)
        wait_text(page, "#engines", "openai", 10)
        summary = json.loads(client(url).predict("hf,openai", "2", "mixed", 8, 1, 1, 2.0, "ttft=30",
                                                 api_name="/run_and_wait"))
        assert summary["status"] == "ok" and summary["load"]["rate"] == 2.0
        runs = {r["engine"]: r for r in summary["runs"]}
        assert runs["openai"]["output_tokens"] == 16 and runs["openai"]["queue_s"]["p50"] is not None
        assert runs["openai"]["slo_met"] == 2 and set(summary["ratios"]) == {"openai/hf"}
        assert summary["endpoints"] == [{"name": "openai", "base_url": server.url, "model": server.model}]
        page.close()
    finally:
        stop(server)


# -- the KV cache tab -----------------------------------------------------------------------------------
def test_kv_parameters_split_on_whitespace_only_so_tuples_keep_their_commas():
    from lab.app.ui_kv import parse_pairs

    assert parse_pairs("users=1,5  output_len=24, workload=mixed") == {
        "users": "1,5", "output_len": "24", "workload": "mixed"}
    assert parse_pairs("") == {}
    with pytest.raises(ValueError, match="'5' is not key=value"):
        parse_pairs("users=1, 5")
    with pytest.raises(ValueError, match="users is given twice"):
        parse_pairs("users=1 users=2")


def open_kv_tab(browser, url, **options):
    return open_tab(browser, url, "KV cache", "#kv-run", **options)


def run_kv(page, name, params):
    """Choose an experiment (its hint follows), type its parameters and press Run."""
    page.click("#kv-experiment input")
    page.get_by_role("option", name=f"{name}: ").click()
    wait_text(page, "#kv-params-hint", f"{name} takes (defaults)", 20)
    page.fill("#kv-params textarea", params)
    page.click("#kv-run")


@pytest.mark.ui
def test_kv_tab_bad_parameters_show_an_input_error_and_nothing_starts(served, browser):
    from lab.experiments import module

    host, url = served
    before = host.last("experiment")
    page = open_kv_tab(browser, url)
    run_kv(page, "preemption", "kv_blocks=1")
    hint = page.inner_text("#kv-params-hint")  # the dropdown's choice: its Params' fields
    assert all(f.name in hint for f in dataclasses.fields(module("preemption").Params)), hint
    wait_text(page, "#kv-message", "Input error", 20)
    assert "kv_blocks" in page.inner_text("#kv-message")
    assert host.last("experiment") is before and not host.running()
    page.close()


LIVE_GRID_IN_USE = """() => {
    const e = document.querySelector('#kv-live');
    const m = e && e.innerText.match(/DERIVED from token counts: (\\d+)\\//);
    return m !== null && Number(m[1]) > 0;
}"""


@pytest.mark.ui
def test_kv_tab_runs_blocks_and_draws_the_live_grid(served, browser, tmp_path):
    host, url = served
    page = open_kv_tab(browser, url, viewport={"width": 1400, "height": 900})
    run_kv(page, "blocks", "users=4 output_len=24")
    wait_text(page, "#kv-message", "Experiment blocks", 30)
    assert "started" in page.inner_text("#kv-message")
    page.wait_for_function(LIVE_GRID_IN_USE, timeout=240_000)  # vLLM's level, drawn live with blocks held
    wait_text(page, "#kv-progress", "status ok", 240)
    wait_text(page, "#kv-fields", "num_blocks", 20)
    fields = page.inner_text("#kv-fields")
    assert '"agree"' in fields and '"series"' not in fields
    assert "vLLM's count vs derived" in page.inner_text("#kv-figure")
    assert page.eval_on_selector("#kv-figure", "e => e.querySelectorAll('g.trace').length") >= 2
    assert host.last("experiment").fields["samples"] > 0
    shot = Path(os.environ.get("KVLAB_KV_SCREENSHOT", tmp_path / "kv_blocks.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.close()


def test_kv_tab_play_moves_the_step_slider_to_the_end_and_a_tick_after_pause_moves_nothing():
    from types import SimpleNamespace

    from lab.app.ui_kv import PLAY_FRAMES, KvHandlers
    from tests.test_table import recorded

    experiment = SimpleNamespace(**vars(recorded()), id="recorded")
    handlers = KvHandlers(SimpleNamespace(last=lambda kind: experiment))
    slider, _, said, _ = handlers.table_controls()  # opens where most requests held one block at once, the last time
    assert (slider["value"], slider["maximum"]) == (71, 125) and said.startswith("After step 71, 4 requests")
    playing, timer, label, value = handlers.play(False, 125)  # Play at the end starts over
    assert playing and timer["active"] and label == "Pause" and value == 0
    assert handlers.advance(True, 0)[3] == 125 // PLAY_FRAMES
    playing, timer, label, value = handlers.advance(True, 124)
    assert (playing, timer["active"], label, value) == (False, False, "Play", 125)  # stopped at the last step
    assert handlers.advance(False, 10)[0] is False and "value" not in handlers.advance(False, 10)[3]


POOL_CELLS = """() => [...document.querySelectorAll('#kv-figure .heatmaplayer text')].map(
    t => [...t.querySelectorAll('tspan')].map(s => s.textContent).join('|') || t.textContent)"""


@pytest.mark.ui
def test_kv_tab_draws_vllms_real_block_table_at_a_chosen_step_and_the_most_holders(served, browser, tmp_path):
    """Issue #42: the table experiment's ids, read from vLLM, drawn at the step the slider picks with each shared
    block's reference count then; the most requests that held one block at once reported."""
    from lab.experiments.table import default_step

    host, url = served
    page = open_kv_tab(browser, url, viewport={"width": 1400, "height": 1500})
    before = host.last("experiment")
    run_kv(page, "table", "")
    deadline = time.monotonic() + 300  # the page's first frame shows the last experiment's "status ok": wait for ours
    while not ((found := host.last("experiment")) is not before and found.experiment == "table" and found.ended_at):
        assert time.monotonic() < deadline, getattr(found, "message", "no experiment")
        time.sleep(0.2)
    wait_text(page, "#kv-progress", "status ok", 60)
    result = host.last("experiment")
    own = result.engine_args["vllm"]  # the experiment's own engine, not the session's pool
    assert (own["num_kv_blocks"], own["block_size"]) == (48, 32) == (result.fields["num_blocks"],
                                                                     result.fields["block_size"])
    steps = result.series["steps"]
    step = next(s["step"] for s in steps if s["shared"] and s["step"] != default_step(steps))
    page.wait_for_selector("#kv-table-step", state="visible", timeout=20_000)
    box = page.locator("#kv-table-step input[type=number]")
    box.fill(str(step))
    box.press("Enter")
    wait_text(page, "#kv-table-sentence", f"After step {step}, {len(steps[step]['tables'])} request", 30)
    assert f"after engine step {step} of {len(steps) - 1}" in page.inner_text("#kv-figure")
    cells, shared = page.evaluate(POOL_CELLS), {int(b): n for b, n in steps[step]["shared"].items()}
    assert shared and all(f"{b}|x{n}" in cells for b, n in shared.items())  # the pool: id and refcount at the step
    assert all(f"{b}|{request}" in cells for request, ids in steps[step]["tables"].items() for b in ids
               if b not in shared)
    most = result.fields["most_holders"]
    assert most["holders"] == max(n for s in steps for n in s["shared"].values())
    wait_text(page, "#kv-answer", f"up to {most['holders']} at once (block {most['block']} after step "
                                  f"{most['step']})", 20)
    shot = Path(os.environ.get("KVLAB_TABLE_SCREENSHOT", tmp_path / "kv_table.png"))
    page.screenshot(path=str(shot), full_page=True)
    page.close()


# -- the Sweeps tab -------------------------------------------------------------------------------------
@pytest.mark.ui
def test_sweep_tab_refuses_a_bad_value_then_runs_a_sweep_and_draws_each_value(served, browser, tmp_path):
    host, url = served
    page = open_ready(browser, url, viewport={"width": 1400, "height": 1800})
    page.get_by_role("tab", name="Sweeps").click()
    page.wait_for_selector("#sweep-run", state="visible")
    assert page.input_value("#sweep-values textarea") == "1,4,16"  # max_num_seqs on CPU
    page.click("#sweep-knob input")
    page.get_by_role("option", name="block_size (vllm)").click()
    page.wait_for_function("() => document.querySelector('#sweep-values textarea').value === '32,64,128'")
    page.fill("#sweep-values textarea", "32,48")
    page.click("#sweep-run")
    wait_text(page, "#sweep-message", "Input error", 20)
    assert "multiple of 32" in page.inner_text("#sweep-message") and host.last("sweep") is None
    page.click("#sweep-knob input")  # HF's knob: its restarts take seconds (vLLM's, ~15 s each on 2 cores, are
    #                                   tests/test_sweeps.py's); the tab's path is the same for every knob
    page.get_by_role("option", name="hf_max_batch_size (hf)").click()
    page.wait_for_function("() => document.querySelector('#sweep-values textarea').value === '1,2,4'")
    page.fill("#sweep-values textarea", "2,4")  # then a restore: the session's own 32
    page.fill("#sweep-users textarea", "2")
    page.fill("#sweep-requests input", "1")
    page.fill("#sweep-output-len input", "8")
    page.click("#sweep-run")
    wait_text(page, "#sweep-message", "started", 30)
    wait_text(page, "#sweep-progress", "hf_max_batch_size=2 (1/2; 1 left after it)", 30)
    wait_text(page, "#sweep-progress", "hf restored with the session's setting", 300)
    wait_text(page, "#sweep-stored", host.last("sweep").id, 20)
    assert [p["engine_arg"] for p in host.last("sweep").points] == ["max_batch_size=2", "max_batch_size=4"]
    host.wait_task(30)  # the sweep's task ends right after the restore
    restored = host.environment()["engines"]["hf"]["args"]["max_batch_size"]
    assert restored == host.config.hf_max_batch_size == 32 and not host.running()
    progress = page.inner_text("#sweep-progress")
    assert "status ok" in progress and "2 (restart" in progress and "4 (restart" in progress  # restart times
    assert page.eval_on_selector("#sweep-figure", "e => e.querySelectorAll('g.trace').length") >= 5
    assert "max_batch_size=4" in page.inner_text("#sweep-points")
    shot = Path(os.environ.get("KVLAB_SWEEP_SCREENSHOT", tmp_path / "sweep.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.close()
    later = open_ready(browser, url)  # a page opened later lists the stored sweep, draws it and offers its files
    later.get_by_role("tab", name="Sweeps").click()
    sweep_id = host.last("sweep").id
    wait_text(later, "#sweep-stored", sweep_id, 20)
    later.click("#sweep-chosen input")
    later.get_by_role("option", name=f"({sweep_id})").click()
    wait_text(later, "#sweep-points", "max_batch_size=4", 20)
    later.wait_for_selector("a[href*='sweep.csv']", timeout=10_000)  # its download link
    later.close()


# -- the Why tab ----------------------------------------------------------------------------------------
def open_why_tab(browser, url, **options):
    return open_tab(browser, url, "Why", "#why-run", **options)


def run_ladder(page, repeats, rungs, users="1"):
    """The overhead preset (the cheapest load) at ``users``: the tab's default (spread at every load) takes minutes."""
    page.click("#why-preset input")
    page.get_by_role("option", name=re.compile("^overhead")).click()
    page.fill("#why-repeats input", str(repeats))
    page.fill("#why-rungs textarea", rungs)
    page.fill("#why-users textarea", users)
    page.click("#why-run")


@pytest.mark.ui
def test_why_tab_refuses_a_bad_rung_then_runs_a_ladder_draws_it_and_stores_it(served, browser, tmp_path):
    from lab.store import list_experiments

    host, url = served
    before = host.last("experiment")
    page = open_why_tab(browser, url, viewport={"width": 1400, "height": 900})
    page.wait_for_selector("#why-run:enabled", timeout=20_000)
    run_ladder(page, 1, "hf,warp")
    wait_text(page, "#why-message", "Input error", 20)
    assert "unknown rung 'warp'" in page.inner_text("#why-message")
    assert host.last("experiment") is before and not host.running()
    run_ladder(page, 1, "hf,vllm", users="1,2")
    wait_text(page, "#why-message", "Experiment why", 30)
    wait_text(page, "#why-progress", "status ok", 240)
    wait_text(page, "#why-caption", "HF's output tok/s", 20)
    levels = host.last("experiment").fields["levels"]
    caption = page.inner_text("#why-caption")
    assert "Across users (measured)" in caption and "taken apart by steps" in caption  # factors across users
    for users in ("1", "2"):  # a loss said as one (vLLM lost at 1 user once on a loaded 2-core machine)
        assert f"{times(levels[users]['total']['value'])} at {users} user" in caption
    assert page.eval_on_selector("#why-figure", "e => e.querySelectorAll('g.trace').length") >= 3  # total + steps
    factors = page.inner_text("#why-factors")
    assert "hf → vllm" in factors and "users" in factors
    assert [d["experiment_id"] for d in list_experiments(host.db_path, "why")][0] == host.last("experiment").id
    page.click("#why-stored input")
    page.get_by_role("option", name=host.last("experiment").id).click()  # the history shows it again
    wait_text(page, "#why-caption", "HF's output tok/s", 20)
    page.screenshot(path=str(tmp_path / "why.png"), full_page=True)
    page.close()


@pytest.mark.ui
def test_why_tab_cancel_keeps_the_turns_measured(served, browser):
    from lab.store import list_experiments

    host, url = served
    page = open_why_tab(browser, url)
    page.wait_for_selector("#why-run:enabled", timeout=20_000)
    run_ladder(page, 5, "hf,vllm", users="1")
    wait_text(page, "#why-message", "started", 30)
    deadline = time.monotonic() + 240
    while not ((found := host.last("experiment")) and found.experiment == "why" and len(found.rows) >= 2):
        assert time.monotonic() < deadline and not found.error, found.message
        time.sleep(0.2)
    page.click("#why-cancel")
    wait_text(page, "#why-progress", "cancelled", 60)
    result = host.last("experiment")
    assert result.status == "cancelled" and 2 <= len(result.rows) < 10 and result.fields["total"] is not None
    stored = {d["experiment_id"]: d for d in list_experiments(host.db_path, "why")}
    mine = stored[result.id]
    assert mine["status"] == "cancelled" and mine["rungs"]["hf"]["tok_s"]
    page.close()


# -- the Capacity tab -----------------------------------------------------------------------------------
def run_capacity(page, slo, max_users, output_len=8, engines=("HF",)):
    """Fill the Capacity form (short answers, 1 request per user, 2 per probe at least) and press Run."""
    page.fill("#capacity-slo textarea", slo)
    for name in ("HF", "vLLM"):
        box = page.locator("#capacity-engines").get_by_label(name, exact=True)
        box.check() if name in engines else box.uncheck()
    for field, value in (("max-users", max_users), ("output-len", output_len), ("requests", 1), ("min", 2),
                         ("time-limit", 120)):
        page.fill(f"#capacity-{field} input", str(value))
    page.click("#capacity-run")


@pytest.mark.ui
def test_capacity_tab_refuses_a_bad_target_then_searches_draws_cancels_and_stores(served, browser, room, tmp_path):
    """An attendee's Run is disabled, the reason beside it; the presenter's bad target is named; a search of HF to 2
    users under a loose target draws its probes, the target and the capacity with the computed caption; a second
    search cancelled after its first probe keeps it; both are listed, and the first one's report comes."""
    from lab.capacity.stored import stored_searches

    host, url = served
    before = host.last("capacity")
    attendee = open_tab(browser, url, "Capacity", "#capacity-run")
    watching(attendee, "capacity")  # disabled, the reason beside it
    attendee.close()
    assert host.last("capacity") is before and not host.running()
    page = open_tab(browser, f"{url}?token={room}", "Capacity", "#capacity-run", viewport={"width": 1400,
                                                                                              "height": 1000})
    wait_text(page, "#role", "Presenter:", 20)
    page.wait_for_selector("#capacity-run:enabled", timeout=20_000)
    run_capacity(page, "ttft_p95=0", 2)
    wait_text(page, "#capacity-message", "Input error", 20)
    assert "slo: ttft_p95 must be a positive time" in page.inner_text("#capacity-message")
    assert host.last("capacity") is before and not host.running()
    run_capacity(page, "ttft_p95=30s,tpot_p95=2s", 2)
    wait_text(page, "#capacity-message", "Capacity search (", 20)
    wait_text(page, "#capacity-progress", "status ok", 60)
    wait_text(page, "#capacity-caption", "HF served at least 2 users", 10)
    first = host.last("capacity")
    assert [probe.level for _, probe in first.probes] == [1, 2] and "nearest its limit came" in page.inner_text(
        "#capacity-caption")
    drawn = page.inner_text("#capacity-figure")
    assert "target" in drawn and "HF capacity: at least 2 users" in drawn
    assert page.eval_on_selector("#capacity-figure", "e => e.querySelectorAll('g.trace').length") >= 4
    host.wait_task(30)  # the search's task ends just after its result; then the page's Run comes back
    page.wait_for_selector("#capacity-run:enabled", timeout=10_000)
    run_capacity(page, "ttft_p95=30s,tpot_p95=2s", 64, 32)  # 1, 2, 4, ... 64 users: cancelled after a probe
    deadline = time.monotonic() + 60
    while not (host.last("capacity").id != first.id and host.last("capacity").probes):
        assert time.monotonic() < deadline and not host.last("capacity").error, host.last("capacity").message
        time.sleep(0.2)
    page.click("#capacity-cancel")
    wait_text(page, "#capacity-progress", "cancelled", 30)
    wait_text(page, "#capacity-caption", "ended early (cancelled)", 10)
    second = host.last("capacity")
    kept = {d["capacity_id"]: d for d in stored_searches(host.db_path)}
    assert second.id != first.id and kept[second.id]["status"] == "cancelled" and kept[second.id]["probes"]
    listed = client(url).predict(api_name="/load_capacities")  # the Results tab's list of stored searches
    rows = {row[-1]: dict(zip(listed["headers"], row, strict=True)) for row in listed["data"]}
    assert rows[first.id]["HF capacity"] == ">= 2 users" and rows[second.id]["status"] == "cancelled"
    page.click("#capacity-stored input")
    page.get_by_role("option", name=first.id).click()  # the history shows the first again, with its report
    wait_text(page, "#capacity-caption", "HF served at least 2 users", 20)
    page.wait_for_selector(f"a[href*='report-{first.id}.html']", timeout=20_000)
    page.screenshot(path=str(tmp_path / "capacity.png"), full_page=True)
    page.close()
