"""build_app(): the Gradio layout and its wiring, nothing else.

Every figure and table comes from lab.dashboard / lab.plots / lab.store, the functions the CLI and the
notebooks use. State lives in the LabHost passed in (no module globals); a gr.Timer asks it once a
second whether anything changed, and the plots are rebuilt only then.
"""

from __future__ import annotations

import json
import tempfile

import gradio as gr
import pandas as pd

from lab.config import ENGINE_NAMES
from lab.dashboard import (
    BOUND_REQUESTS, BOUND_SECONDS, environment_markdown, live_view, plan_from_inputs, progress_text,
)
from lab.host import LabHost
from lab.load.workloads import WORKLOADS
from lab.plots import compare_figure, compare_ratio_figure, latency_table
from lab.runs import summary_dict
from lab.store import export_run, list_runs, load_summary

INTRO = """# KV Lab — why vLLM outruns HF `generate()`
One model, loaded twice in this process: **HF transformers** with static batching (a padded batch runs until
its longest request ends; its KV cache is one contiguous block per batch) and **vLLM** (PagedAttention and
continuous batching). Pick a workload and concurrent users, press **Run**, and watch both measured live."""


def build_app(host: LabHost) -> gr.Blocks:
    """Lay out the dashboard and wire it to ``host``.

    Args:
        host: The engine host (loading or loaded).

    Returns:
        The Blocks app (not launched).
    """
    config = host.config

    def start_run(engines, users, workload, output_len, bound, amount):
        try:
            plan = plan_from_inputs(config, engines, users, workload, output_len, bound, amount)
        except ValueError as exc:
            return f"**Input error:** {exc}"
        started, message = host.submit(plan)
        return message if started else f"**Not started:** {message}"

    def refresh(seen):
        result = host.result
        key = [host.version, result.status if result else None, host.status.ready]
        if key == seen:
            return [gr.skip()] * 13
        just_finished = bool(seen) and seen[1] == "running" and key[1] != "running"
        runs_table = runs_frame() if just_finished else gr.skip()
        env = list(show_environment()) if not seen or seen[2] != key[2] else [gr.skip()] * 2
        head = [key, host.status.text()]
        if result is None:
            return head + [progress_text(None)] + [gr.skip()] * 7 + [runs_table] + env
        view = live_view(result)
        return head + [view.progress, view.throughput, view.tok_s_bars, view.ratio, view.queue, view.vllm_kv,
                       view.hf_kv, view.latency, runs_table] + env

    def show_environment():
        env = host.environment()
        return environment_markdown(env), env

    def runs_frame() -> pd.DataFrame:
        return pd.DataFrame(list_runs(host.db_path))

    def load_runs():
        frame = runs_frame()
        return frame, gr.update(choices=list(frame["run_id"]) if len(frame) else [])

    def compare(run_ids):
        if not run_ids:
            return None, None, None, None, None
        summaries = [load_summary(host.db_path, rid) for rid in run_ids]
        folder = tempfile.mkdtemp(prefix="kvlab-export-")
        paths = export_run(host.db_path, run_ids[0], folder)
        table = latency_table(summaries[0])
        return (compare_figure(summaries), compare_ratio_figure(summaries), table,
                str(paths["requests"]), str(paths["summary"]))

    def run_and_wait(engines: str, users: str, workload: str, output_len: int, requests_per_user: int) -> str:
        """Start a run, wait for it to end, and return its summary.json (for API clients)."""
        names = [e.strip() for e in engines.split(",") if e.strip()]
        try:
            plan = plan_from_inputs(config, names, users, workload, output_len, BOUND_REQUESTS, requests_per_user)
        except ValueError as exc:
            return json.dumps({"error": str(exc)})
        started, message = host.submit(plan)
        if not started:
            return json.dumps({"error": message})
        result = host.wait_run()
        return json.dumps(summary_dict(result), default=str)

    with gr.Blocks(title="KV Lab") as app:
        gr.Markdown(INTRO)
        load_status = gr.Markdown(host.status.text(), elem_id="load-status")
        with gr.Tabs():
            with gr.Tab("Load test", id="load"):
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
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run")
                    cancel_button = gr.Button("Cancel", variant="stop", elem_id="cancel")
                message = gr.Markdown(elem_id="message")
                progress = gr.Markdown(progress_text(host.result), elem_id="progress")
                with gr.Row():
                    throughput_plot = gr.Plot(label="Output tok/s over time", elem_id="plot-throughput")
                    bars_plot = gr.Plot(label="Output tok/s per user level", elem_id="plot-bars")
                with gr.Row():
                    ratio_plot = gr.Plot(label="Improvement ratio vLLM/HF", elem_id="plot-ratio")
                    queue_plot = gr.Plot(label="Running / waiting", elem_id="plot-queue")
                with gr.Row():
                    vllm_kv_plot = gr.Plot(label="vLLM KV blocks", elem_id="plot-vllm-kv")
                    hf_kv_plot = gr.Plot(label="HF KV reserved vs real", elem_id="plot-hf-kv")
                latency = gr.Dataframe(label="Latency (ms) per engine and user level", elem_id="latency")
            with gr.Tab("Results", id="results"):
                refresh_runs = gr.Button("Refresh")
                runs_table = gr.Dataframe(label="Past runs (stored as they finish, partial ones too)",
                                          elem_id="runs-table")
                chosen = gr.Dropdown([], multiselect=True, label="Runs to compare (the first is downloadable)")
                with gr.Row():
                    compare_plot = gr.Plot(label="tok/s compared")
                    compare_ratio = gr.Plot(label="ratio compared")
                compare_table = gr.Dataframe(label="Latency of the first chosen run")
                with gr.Row():
                    csv_file = gr.File(label="requests.csv")
                    json_file = gr.File(label="summary.json")
            with gr.Tab("Environment", id="env"):
                env_text = gr.Markdown()
                env_json = gr.JSON(label="raw")
                env_refresh = gr.Button("Refresh")

        seen = gr.State(None)
        timer = gr.Timer(1.0)
        timer.tick(refresh, [seen], [seen, load_status, progress, throughput_plot, bars_plot, ratio_plot,
                                     queue_plot, vllm_kv_plot, hf_kv_plot, latency, runs_table, env_text, env_json],
                   show_progress="hidden", queue=False, api_visibility="private")
        run_button.click(start_run, [engines, users, workload, output_len, bound, amount], [message],
                         api_name="start_run")
        cancel_button.click(lambda: host.cancel(), None, [message], api_name="cancel")
        refresh_runs.click(load_runs, None, [runs_table, chosen])
        chosen.change(compare, [chosen], [compare_plot, compare_ratio, compare_table, csv_file, json_file])
        env_refresh.click(show_environment, None, [env_text, env_json], api_name="environment")
        app.load(show_environment, None, [env_text, env_json], api_visibility="private")
        app.load(load_runs, None, [runs_table, chosen], api_visibility="private")
        gr.api(run_and_wait, api_name="run_and_wait")
    return app
