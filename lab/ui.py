"""build_app(): the Gradio layout and its wiring; the handlers it wires are small named methods of Handlers.

Every figure and table comes from lab.dashboard / lab.plots / lab.store, the functions the CLI and the
notebooks use. State lives in the LabHost passed in (no module globals). As in trackio, a gr.Timer writes
cheap change keys into gr.State once a second, and a group of components is redrawn only when its own key
changed (the State's change event): the load status line, the live plots, the runs table when a run ends,
the environment when the engines become ready.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from lab.config import ENGINE_NAMES
from lab.dashboard import (
    BOUND_REQUESTS,
    BOUND_SECONDS,
    agreement_warning,
    environment_markdown,
    live_view,
    plan_from_inputs,
    progress_text,
)
from lab.estimate import estimate_text
from lab.host import LabHost
from lab.load.workloads import WORKLOADS
from lab.plots import LATENCY_COLUMNS, compare_figure, compare_ratio_figure, latency_table
from lab.presets import workshop_demo
from lab.runs import RUNNING, summary_dict
from lab.store import export_run, list_runs, list_summaries, load_summary, run_label
from lab.ui_kv import build_kv_tab
from lab.ui_sweep import SweepHandlers, build_sweep_tab
from lab.ui_timer import redraw_on_change

INTRO = """# KV Lab — why vLLM outruns HF `generate()`
One model, loaded twice in this process: **HF transformers** with static batching (a padded batch runs until
its longest request ends; its KV cache is one contiguous block per batch) and **vLLM** (PagedAttention and
continuous batching). Pick a workload and concurrent users, press **Run**, and watch both measured live."""
PEAK_NOTE = ("*Over time, each point counts the tokens that arrived in one second; a level's bar divides all "
             "its tokens by its whole duration, which includes its first prefill and the tail when few requests "
             "are left, so the per-second peaks lie above the bar.*")
TICK_S = 1.0  # how often each page asks the host whether anything changed
QUIET = {"show_progress": "hidden", "api_visibility": "private"}  # timer-driven events: no spinner, no API


class Handlers:
    """Every event handler of the page, over one LabHost: actions, change keys and the redraws they gate."""

    def __init__(self, host: LabHost):
        self.host = host

    # -- actions -------------------------------------------------------------------------------
    def start_run(self, engines, users, workload, output_len, bound, amount) -> str:
        """Start a run from the Load-test form; returns the message line."""
        try:
            plan = plan_from_inputs(self.host.config, engines, users, workload, output_len, bound, amount)
        except ValueError as exc:
            return f"**Input error:** {exc}"
        started, message = self.host.submit(plan)
        return message if started else f"**Not started:** {message}"

    def estimate(self, engines, users, workload, output_len, bound, amount) -> str:
        """How long the form's run should take here, learned from stored runs (or the input error, early)."""
        try:
            plan = plan_from_inputs(self.host.config, engines, users, workload, output_len, bound, amount)
        except ValueError as exc:
            return f"**Input error:** {exc}"
        return estimate_text(plan, list_summaries(self.host.db_path), self.host.check.model,
                             self.host.check.memory.device.name)

    def run_ended(self, message: str):
        """Once the run has ended, this page's 'started' or 'Cancelling' line for it says so (others stay)."""
        result = self.host.result
        if result is None or result.status == RUNNING:  # the key also changes when a new run starts
            return gr.skip()
        if not (result.run_id in (message or "") or (message or "").startswith("Cancelling")):
            return gr.skip()
        return f"Run {result.run_id} ended: {result.status}."

    def form_now(self) -> list:
        """The running run's settings, for a browser that opens the page while it goes (else unchanged)."""
        result = self.host.result
        if result is None or result.status != RUNNING:
            return [gr.skip()] * 6
        load = result.plan.load
        bound, amount = (BOUND_REQUESTS, load.requests_per_user) if load.requests_per_user else (
            BOUND_SECONDS, load.duration_s)
        return [list(result.plan.engines), ",".join(map(str, load.users)), load.workload, load.output_len or 0,
                bound, amount]

    def demo_form(self) -> list:
        """The Workshop demo's form values for this device (the button then presses Run)."""
        preset = workshop_demo(self.host.config)
        return [list(ENGINE_NAMES), preset.users, preset.workload, preset.output_len, BOUND_REQUESTS,
                preset.requests_per_user]

    def cancel(self) -> str:
        """Cancel the run in progress; returns the message line."""
        return self.host.cancel()

    def run_and_wait(self, engines: str, users: str, workload: str, output_len: int, requests_per_user: int) -> str:
        """Start a run, wait for it to end, and return its summary.json (for API clients)."""
        names = [e.strip() for e in engines.split(",") if e.strip()]
        try:
            plan = plan_from_inputs(self.host.config, names, users, workload, output_len, BOUND_REQUESTS,
                                    requests_per_user)
        except ValueError as exc:
            return json.dumps({"error": str(exc)})
        started, message = self.host.submit(plan)
        if not started:
            return json.dumps({"error": message})
        return json.dumps(summary_dict(self.host.wait_run()), default=str)

    # -- change keys: cheap, read every tick -----------------------------------------------------
    def status_key(self) -> str:
        """Changes with every loading step (the agreement warning comes with the last one)."""
        return self.host.status.text()

    def live_key(self) -> tuple | None:
        """Changes whenever the current run has something new to draw; None before the first run."""
        result = self.host.result
        return (result.run_id, self.host.version) if result else None

    def finished_key(self) -> str | None:
        """The id of the last run once it has ended (changes when a run finishes)."""
        result = self.host.result
        return result.run_id if result and result.status != RUNNING else None

    def ready_key(self) -> tuple[bool, str]:
        """Changes when the engines become ready (or fail to load)."""
        return self.host.status.ready, self.host.status.error

    # -- redraws -------------------------------------------------------------------------------
    def status_lines(self) -> tuple[str, str]:
        """The load status line and the agreement warning under it."""
        return self.host.status.text(), agreement_warning(self.host.agreement())

    def live(self) -> list:
        """Progress line, the six live figures and the latency table of the current run."""
        result = self.host.result
        if result is None:
            return [progress_text(None)] + [gr.skip()] * 7
        view = live_view(result)
        return [view.progress, view.throughput, view.tok_s_bars, view.ratio, view.queue, view.vllm_kv,
                view.kv_tokens, view.latency]

    def buttons(self) -> tuple:
        """Run and Workshop demo: pressable once the engines are ready."""
        ready = gr.update(interactive=self.host.status.ready)
        return ready, ready

    def environment(self) -> tuple[str, dict]:
        """The Environment tab: readable text and the raw dict."""
        env = self.host.environment()
        return environment_markdown(env), env

    def load_runs(self) -> tuple[pd.DataFrame, Any]:
        """The stored runs, and the compare dropdown's choices (labelled)."""
        rows = list_runs(self.host.db_path)
        return pd.DataFrame(rows), gr.update(choices=[(run_label(row), row["run_id"]) for row in rows])

    def compare(self, run_ids: list[str] | None) -> tuple:
        """Figures comparing the chosen runs, the first one's latency table and its two files."""
        if not run_ids:
            return None, None, None, None, None, None
        summaries = [load_summary(self.host.db_path, rid) for rid in run_ids]
        paths = export_run(self.host.db_path, run_ids[0], tempfile.mkdtemp(prefix="kvlab-export-"))
        return (compare_figure(summaries), compare_ratio_figure(summaries), latency_table(summaries[0]),
                summaries[0].get("engine_args", {}), str(paths["requests"]), str(paths["summary"]))


@dataclass
class LoadTab:
    """The Load-test tab's components: the form (in start_run's order), its buttons, what draws live."""

    form: list
    estimate: gr.Markdown
    run: gr.Button
    demo: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    live: list  # in Handlers.live's order


@dataclass
class ResultsTab:
    """The Results tab's components."""

    refresh: gr.Button
    runs: list  # runs table and the compare dropdown, in Handlers.load_runs's order
    chosen: gr.Dropdown
    compared: list  # in Handlers.compare's order


@dataclass
class EnvironmentTab:
    """The Environment tab's components."""

    shown: list  # text and raw dict, in Handlers.environment's order
    refresh: gr.Button


def build_app(host: LabHost) -> gr.Blocks:
    """Lay out the dashboard and wire it to ``host``.

    Args:
        host: The engine host (loading or loaded).

    Returns:
        The Blocks app (not launched).
    """
    handlers = Handlers(host)
    with gr.Blocks(title="KV Lab") as app:
        gr.Markdown(INTRO)
        header = [gr.Markdown(host.status.text(), elem_id="load-status"),
                  gr.Markdown(agreement_warning(host.agreement()), elem_id="agreement-warning")]
        with gr.Tabs():
            load = _load_tab(host)
            build_kv_tab(host, TICK_S, QUIET)
            sweeps = build_sweep_tab(host, TICK_S, QUIET)
            results, env = _results_tab(), _environment_tab()
        _wire_actions(handlers, load, results, env)  # first: they claim the public API names
        _wire_timer(handlers, header, load, results, env)
        app.load(handlers.load_runs, None, results.runs, api_visibility="private")
        app.load(SweepHandlers(host).stored, None, sweeps.stored, api_visibility="private")  # as runs are
        app.load(handlers.form_now, None, load.form, api_visibility="private").then(
            handlers.estimate, load.form, [load.estimate], api_visibility="private")
        gr.api(handlers.run_and_wait, api_name="run_and_wait")
    return app


def _load_tab(host: LabHost) -> LoadTab:
    """The Load-test tab: the form, Run and Cancel, then the live figures."""
    with gr.Tab("Load test", id="load"):
        form = _form()
        estimate = gr.Markdown(elem_id="estimate")
        with gr.Row():
            run = gr.Button("Run", variant="primary", elem_id="run", interactive=host.status.ready)
            demo = gr.Button("Workshop demo", elem_id="demo", interactive=host.status.ready)
            cancel = gr.Button("Cancel", variant="stop", elem_id="cancel")
        gr.Markdown(f"**Workshop demo:** {workshop_demo(host.config).why}", elem_id="demo-why")
        message = gr.Markdown(elem_id="message")
        live = _live_outputs(host)
    return LoadTab(form=form, estimate=estimate, run=run, demo=demo, cancel=cancel, message=message, live=live)


def _form() -> list:
    """Engines, users, workload, output length, bound and amount (Handlers.start_run's arguments)."""
    with gr.Row():
        engines = gr.CheckboxGroup(list(ENGINE_NAMES), value=list(ENGINE_NAMES), label="Engines")
        users = gr.Textbox("1,5,10,20", label="Concurrent users (comma list)", elem_id="users")
        workload = gr.Dropdown([(f"{w.name}: {w.description}", w.name) for w in WORKLOADS.values()],
                               value="mixed", label="Workload")
    with gr.Row():
        output_len = gr.Number(0, precision=0, label="Output length in tokens (0 = the workload's)",
                               elem_id="output-len")
        bound = gr.Radio([BOUND_REQUESTS, BOUND_SECONDS], value=BOUND_REQUESTS, label="Bound each level by")
        amount = gr.Number(2, label="Requests per user / seconds per level", elem_id="amount")
    return [engines, users, workload, output_len, bound, amount]


def _live_outputs(host: LabHost) -> list:
    """The progress line, six figures in three rows (ratio and per-level bars first), and the latency table
    (returned in Handlers.live's order)."""
    progress = gr.Markdown(progress_text(host.result), elem_id="progress")
    with gr.Row():  # the story first: how much faster, then the speeds it divides
        ratio = gr.Plot(label="Improvement ratio vLLM/HF", elem_id="plot-ratio")
        bars = gr.Plot(label="Output tok/s per user level", elem_id="plot-bars")
    with gr.Row():
        throughput = gr.Plot(label="Output tok/s over time", elem_id="plot-throughput")
        queue = gr.Plot(label="Running / waiting", elem_id="plot-queue")
    gr.Markdown(PEAK_NOTE, elem_id="peak-note")
    with gr.Row():
        vllm_kv = gr.Plot(label="vLLM KV blocks", elem_id="plot-vllm-kv")
        kv_tokens = gr.Plot(label="KV cache of both engines, in tokens", elem_id="plot-kv-tokens")
    latency = gr.Dataframe(pd.DataFrame(columns=LATENCY_COLUMNS), label="Latency (ms) per engine and user level",
                           elem_id="latency")
    return [progress, throughput, bars, ratio, queue, vllm_kv, kv_tokens, latency]


def _results_tab() -> ResultsTab:
    """The Results tab: past runs, a multi-select to compare them, the first one's files."""
    with gr.Tab("Results", id="results"):
        refresh = gr.Button("Refresh")
        runs_table = gr.Dataframe(label="Past runs (stored as they finish, partial ones too)", elem_id="runs-table")
        chosen = gr.Dropdown([], multiselect=True, label="Runs to compare (the first is downloadable)")
        with gr.Row():
            compare_plot, compare_ratio = gr.Plot(label="tok/s compared"), gr.Plot(label="ratio compared")
        compare_table = gr.Dataframe(label="Latency of the first chosen run")
        args = gr.JSON(label="Engine args of the first chosen run", elem_id="compare-args")
        with gr.Row():
            csv_file, json_file = gr.File(label="requests.csv"), gr.File(label="summary.json")
    return ResultsTab(refresh=refresh, runs=[runs_table, chosen], chosen=chosen,
                      compared=[compare_plot, compare_ratio, compare_table, args, csv_file, json_file])


def _environment_tab() -> EnvironmentTab:
    """The Environment tab: device, model, engines and the agreement check, as text and as the raw dict."""
    with gr.Tab("Environment", id="env"):
        text = gr.Markdown(elem_id="environment")
        raw = gr.JSON(label="raw")
        refresh = gr.Button("Refresh")
    return EnvironmentTab(shown=[text, raw], refresh=refresh)


def _wire_timer(handlers: Handlers, header: list, load: LoadTab, results: ResultsTab, env: EnvironmentTab) -> None:
    """Each tick writes the change keys into gr.State; a group redraws only when its own key changed."""
    groups = [
        (handlers.status_key, handlers.status_lines, header),
        (handlers.live_key, handlers.live, load.live),
        (handlers.finished_key, handlers.load_runs, results.runs),
        (handlers.finished_key, handlers.run_ended, [load.message], [load.message]),
        (handlers.ready_key, handlers.environment, env.shown),
        (handlers.ready_key, handlers.buttons, [load.run, load.demo]),
    ]
    redraw_on_change(groups, TICK_S, QUIET)


def _wire_actions(handlers: Handlers, load: LoadTab, results: ResultsTab, env: EnvironmentTab) -> None:
    """Buttons and the compare dropdown (with the API names the README and the tests use)."""
    load.run.click(handlers.start_run, load.form, [load.message], api_name="start_run")
    for component in load.form:
        component.change(handlers.estimate, load.form, [load.estimate], api_visibility="private", queue=False)
    load.demo.click(handlers.demo_form, None, load.form, api_visibility="private").then(
        handlers.start_run, load.form, [load.message], api_visibility="private")
    load.cancel.click(handlers.cancel, None, [load.message], api_name="cancel")
    results.refresh.click(handlers.load_runs, None, results.runs, api_name="load_runs")
    results.chosen.change(handlers.compare, [results.chosen], results.compared, api_name="compare")
    env.refresh.click(handlers.environment, None, env.shown, api_name="environment")
