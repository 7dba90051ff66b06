"""The "Capacity" tab: how many users each engine serves under a latency target (lab/capacity/), run from the page.

Pure helpers first (the progress line, a result's figure, caption and probe table), then CapacityHandlers over one
Host, then the layout and its wiring. The form's CapacityPlan (lab.app.dashboard.form_plan: the CLI's rules, each
refusal naming the form's field) goes to the host's one ``submit``, as ``python -m lab capacity``'s goes to the CLI's
runner: one task at a time, Cancel keeps the probes finished, and it is stored as the CLI's are, after every probe.
The tab lists every stored search (lab.capacity.stored: the CLI's, the page's, and those stored before as the
experiment capacity_search), each with its report (lab.report) to download; the Results tab lists them too, each
engine's capacity and the ratio in a row (build_searches_list). As in lab/app/ui_why.py, the page's one gr.Timer writes
a cheap change key and the figure, caption and table are redrawn only when it moved.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pandas as pd

from lab.app.dashboard import CapacityForm, TaskView, engine_choices, form_plan, parts
from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker, run_cancel_lines, skipped, start_task
from lab.capacity import DEFAULT_TIME_LIMIT_S, MIN_REQUESTS, PROBES_LABEL, REQUESTS_PER_USER, search_row
from lab.capacity.stored import stored_searches
from lab.capacity.words import capacity_caption
from lab.config import MAX_RATE
from lab.load.workloads import WORKLOADS
from lab.plots.capacity import capacity_figure, probes_table
from lab.report import write_report
from lab.status import RunStatus

NO_SEARCH = "No capacity search yet: set a target and press **Run**."
TARGETS = {"cpu": "ttft_p95=5s,tpot_p95=400ms", "cuda": "ttft_p95=2s,tpot_p95=150ms"}  # docs/capacity.md's runs
MOST_USERS = {"cpu": 8, "cuda": 128}  # a CPU search of two engines to 8 users takes minutes, a GPU's to 128 too
INTRO = ("A throughput ratio says how much faster one engine is at a load you chose; capacity turns the question "
         "around: how many users does each engine serve while its latency percentiles stay within a target? The "
         "search doubles the users from 1 until a level misses the target, then bisects down to adjacent levels "
         "(a level within 10% of a limit runs twice). The figure draws every probe's percentiles against the "
         "users, the target dashed and each engine's capacity dotted; the sentences under it are computed from "
         "the probes. The same search as `python -m lab capacity` (docs/capacity.md).")


# -- pure helpers ------------------------------------------------------------------------------------
def search_progress(result) -> str:
    """One line: the search's targets, status, message and the probes finished."""
    if result is None:
        return NO_SEARCH
    probes = len(result.probes)
    return (f"Capacity search **{result.plan.slo_text()}** ({result.id}): status {result.status}: {result.message}; "
            f"{probes} probe{'' if probes == 1 else 's'} finished")


def search_view(data: dict) -> tuple:
    """A search's figure, computed caption and probe table (capacity.json's dict; empty before it has begun)."""
    if "targets" not in data:
        return capacity_figure(data), "", pd.DataFrame()
    return capacity_figure(data), capacity_caption(data), probes_table(data)


def searches_table(db_path) -> pd.DataFrame:
    """Every stored search (lab.capacity.stored), newest first, as the Results tab lists it
    (lab.capacity.search_row: each engine's capacity and the ratio)."""
    return pd.DataFrame([search_row(d) for d in stored_searches(db_path)])


def stored_label(data: dict) -> str:
    """A stored search as the dropdown names it."""
    return (f"{data['started_at'].replace('T', ' ')[:16]} · {data.get('slo', '?')} · "
            f"{', '.join(data.get('engines', []))} · {data['status']} ({data['capacity_id']})")


# -- handlers ----------------------------------------------------------------------------------------
class CapacityHandlers:
    """The tab's event handlers over one Host."""

    def __init__(self, host: Host):
        self.host = host

    def start(self, slo: str, engines, max_users, workload: str, output_len, requests_per_user, min_requests,
              time_limit, rate_search: bool = False, start_rate=1.0, max_rate=MAX_RATE) -> str:
        """Start a search from the form (CapacityForm's order); returns the message line (an input error names the
        field)."""
        form = CapacityForm(slo, engines, max_users, workload, output_len, requests_per_user, min_requests,
                            time_limit, rate_search, start_rate, max_rate)
        return start_task(self.host, lambda: form_plan(form, self.host.config, self.host.engine_names))

    def cancel(self) -> str:
        return self.host.cancel()

    def search(self):
        """The host's current (or last) capacity search, None before the first."""
        return self.host.last("capacity")

    def result_key(self) -> tuple | None:
        result = self.search()
        if result is None:
            return None
        return result.id, str(result.status), result.message, len(result.probes)

    def ended_key(self) -> tuple:
        """Changes when a search starts and when it ends (the stored list grows then); never None, so that the
        page's first tick lists the stored searches."""
        result = self.search()
        if result is None:
            return "capacity", None, False
        return "capacity", result.id, result.status == RunStatus.RUNNING

    def result_view(self) -> tuple:
        """The progress line, the figure, the computed caption and the probes."""
        result = self.search()
        if result is None:
            return parts(skipped(TaskView, progress=NO_SEARCH))
        figure, caption, probes = search_view(result.to_dict())
        return parts(TaskView(progress=search_progress(result), figure=figure, caption=caption, table=probes))

    def stored(self):
        """The stored searches (the CLI's and the page's), newest first, as the dropdown's choices."""
        return gr.update(choices=[(stored_label(d), d["capacity_id"]) for d in stored_searches(self.host.db_path)])

    def table(self) -> pd.DataFrame:
        """The stored searches as the Results tab lists them."""
        return searches_table(self.host.db_path)

    def show_stored(self, capacity_id: str | None) -> tuple:
        """A stored search's figure, caption and probes, and its report to download."""
        data = next((d for d in stored_searches(self.host.db_path) if d["capacity_id"] == capacity_id), None)
        if data is None:
            return gr.skip(), "No such stored capacity search.", gr.skip(), None
        report = Path(tempfile.mkdtemp(prefix="kvlab-capacity-")) / f"report-{capacity_id}.html"
        return *search_view(data), str(write_report(capacity_id, report, self.host.db_path))


# -- layout and wiring -------------------------------------------------------------------------------
@dataclass
class CapacityTab:
    """The Capacity tab's components."""

    run: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    result: TaskView  # progress, figure, caption, probes


def _form(host: Host) -> CapacityForm:
    """The target, the engines and the search's bounds; the open-loop search folded away."""
    device = host.check.device if host.check.device in TARGETS else "cpu"
    with gr.Row():
        slo = gr.Textbox(TARGETS[device], label="Target (slo: METRIC_pNN=LIMIT, comma list; ttft, tpot, itl, e2e)",
                         elem_id="capacity-slo", scale=3)
        engines = gr.CheckboxGroup(engine_choices(host.engine_names), value=list(host.engine_names),
                                   label="Engines", elem_id="capacity-engines", scale=2)
    with gr.Row():
        most = gr.Number(MOST_USERS[device], label="Max users (max_users)", elem_id="capacity-max-users")
        workload = gr.Dropdown(list(WORKLOADS), value="mixed", label="Workload", elem_id="capacity-workload",
                               allow_custom_value=True)  # an API's unknown name: the lab's message, not Gradio's
        output_len = gr.Number(0, label="Output length (output_len; 0 = the workload's)", elem_id="capacity-output-len")
    with gr.Row():
        per_user = gr.Number(REQUESTS_PER_USER, label="Requests per user (requests_per_user)",
                             elem_id="capacity-requests")
        least = gr.Number(MIN_REQUESTS, label="Requests per probe at least (min_requests)", elem_id="capacity-min")
        limit = gr.Number(DEFAULT_TIME_LIMIT_S, label="Time limit in s (time_limit)", elem_id="capacity-time-limit")
    with gr.Accordion("Open loop: the largest request rate instead (rate_search)", open=False):
        with gr.Row():
            rate_search = gr.Checkbox(False, label="Search the rate (req/s), max users then cap what is in flight",
                                      elem_id="capacity-rate-search")
            start_rate = gr.Number(1.0, label="First rate (start_rate)", elem_id="capacity-start-rate")
            max_rate = gr.Number(MAX_RATE, label="Highest rate (max_rate)", elem_id="capacity-max-rate")
    return CapacityForm(slo=slo, engines=engines, max_users=most, workload=workload, output_len=output_len,
                        requests_per_user=per_user, min_requests=least, time_limit=limit, rate_search=rate_search,
                        start_rate=start_rate, max_rate=max_rate)


def build_capacity_tab(host: Host, ticker: Ticker, guard: Guard) -> CapacityTab:
    """Lay out the Capacity tab (call inside gr.Tabs) and wire it to ``host`` (Run and Cancel behind ``guard``)."""
    handlers = CapacityHandlers(host)
    with gr.Tab("Capacity", id="capacity"):
        gr.Markdown(INTRO)
        form = _form(host)
        run, cancel, message, progress = run_cancel_lines("capacity", NO_SEARCH, guard)
        figure = gr.Plot(label="Percentiles per probe (measured) and capacity (computed)", elem_id="capacity-figure")
        caption = gr.Markdown(elem_id="capacity-caption")
        probes = gr.DataFrame(label=PROBES_LABEL, elem_id="capacity-probes", wrap=True)
        with gr.Row():
            chosen = gr.Dropdown([], label="Stored capacity searches (the CLI's too)", elem_id="capacity-stored",
                                 scale=3)
            refresh = gr.Button("Refresh", size="sm", scale=1)
        report = gr.File(label="The stored search's report (one HTML file, opens offline)", elem_id="capacity-report")
        tab = CapacityTab(run=run, cancel=cancel, message=message, result=TaskView(progress=progress, figure=figure,
                                                                              caption=caption, table=probes))
    guard.started(run.click(guard(handlers.start, "Starting a capacity search"), parts(form), [message],
                            api_name="start_capacity", show_progress="hidden"))
    cancel.click(guard(handlers.cancel, "Cancelling"), None, [message], api_name="cancel_capacity",
                 show_progress="hidden")
    refresh.click(handlers.stored, None, [chosen], api_visibility="private")
    chosen.change(handlers.show_stored, [chosen], [figure, caption, probes, report], api_visibility="private")
    ticker.add([(handlers.result_key, handlers.result_view, parts(tab.result)),
                (handlers.ended_key, handlers.stored, [chosen])])
    return tab


def build_searches_list(host: Host, ticker: Ticker, refresh: gr.Button) -> gr.Dataframe:
    """The Results tab's list of stored capacity searches (call inside that tab): redrawn when a search starts or
    ends, and by the tab's Refresh."""
    handlers = CapacityHandlers(host)
    table = gr.Dataframe(label="Capacity searches (stored, the CLI's too): each engine's capacity under the target "
                         "and the ratio, computed; each one's probes and report in the Capacity tab",
                         elem_id="capacity-searches", wrap=False)
    refresh.click(handlers.table, None, [table], api_name="load_capacities")
    ticker.add([(handlers.ended_key, handlers.table, [table])])
    return table
