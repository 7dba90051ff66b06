"""The "Sweeps" tab: one engine knob over several values (lab.sweeps), run from the page and drawn as it goes.

SweepHandlers are small named handlers over one Host; the layout and wiring follow. As in lab/app/ui.py,
the page's one gr.Timer (ui_timer.Ticker) writes the tab's cheap change keys into gr.State once a second: the
progress line (with the load run of the value being measured) redraws on every change, the figure and the
points table when a value finishes, and the stored sweeps when one ends. The figure is lab.plots.sweep's, the
notebooks' too.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Generic

import gradio as gr
import pandas as pd

from lab.app.access import CANCEL, START
from lab.app.dashboard import T, parts, progress_text
from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker, skipped, start_task
from lab.estimate import sweep_line
from lab.load.workloads import WORKLOADS
from lab.plots.sweep import sweep_figure
from lab.report import write_report
from lab.status import RunStatus
from lab.store import list_sweeps, load_sweep
from lab.sweeps import KNOBS, default_values, sweep_plan, sweep_progress, write_sweep
from lab.sweeps.words import sweep_answer

DEFAULT_KNOB = "max_num_seqs"
INTRO = ("Each value restarts only the engine the knob belongs to (the other stays loaded), then runs the same "
         "seeded requests on it; the restart is timed and shown. Cancel keeps the values already finished; at "
         "the end the engine is restarted with the session's own setting.")


class SweepHandlers:
    """The tab's event handlers over one Host: actions, change keys and the redraws they gate."""

    def __init__(self, host: Host):
        self.host = host

    # actions
    def start(self, knob, values, users, workload, requests_per_user, output_len) -> str:
        """Start a sweep from the form (SweepForm's order); returns the message line."""
        return start_task(self.host, lambda: sweep_plan(knob, values or "", users or "", workload, requests_per_user,
                                                        output_len))

    def estimate(self, knob, values, users, workload, requests_per_user, output_len) -> str:
        """How long the sweep would take here (lab.estimate); '' while the form has an input error."""
        try:
            return sweep_line(self.host, sweep_plan(knob, values or "", users or "", workload, requests_per_user,
                                                    output_len))
        except ValueError:
            return ""

    def values_for(self, knob: str) -> str:
        """The knob's starting values on this device."""
        return default_values(knob, self.host.config.resolved_device())

    # change keys
    def progress_key(self) -> tuple | None:
        """The progress line itself (a few counts; it changes with the message and every finished request)."""
        return self.progress()

    def points_key(self) -> tuple | None:
        """Changes when a value finishes and when the sweep ends."""
        sweep = self.host.last("sweep")
        return None if sweep is None else (sweep.id, len(sweep.points), str(sweep.status))

    def ended_key(self) -> tuple | None:
        """Changes when the last sweep has ended and its task (the restore and the last save) is done."""
        sweep = self.host.last("sweep")
        if sweep is None or sweep.status == RunStatus.RUNNING:
            return None
        return sweep.id, self.host.running()

    # redraws
    def progress(self) -> str:
        """The sweep's line, and under it the current value's load run."""
        sweep = self.host.last("sweep")
        line = sweep_progress(sweep)
        if sweep is not None and sweep.status == RunStatus.RUNNING and sweep.run is not None:
            line += "  \n" + progress_text(sweep.run)
        return line

    def points(self) -> tuple:
        """The figure, what the points show (computed from them), and one row per finished value."""
        sweep = self.host.last("sweep")
        if sweep is None:
            return parts(skipped(Points))
        return parts(points_view(sweep.to_dict()))

    def stored(self) -> list:
        """Stored sweeps, newest first (id, start, knob, status, values, how many finished), and the choices
        of the dropdown that shows one."""
        sweeps = list_sweeps(self.host.db_path)
        rows = [{"sweep_id": s["sweep_id"], "started": s["started_at"].replace("T", " ")[:16], "knob": s["knob"],
                 "status": s["status"], "values": ",".join(map(str, s["values"])), "finished": len(s["points"]),
                 "device": s.get("device", {}).get("name", ""), "model": s["model"]} for s in sweeps]
        choices = [(f"{r['started']} · {r['knob']} {r['values']} · {r['status']} ({r['sweep_id']})", r["sweep_id"])
                   for r in rows]
        return parts(Stored(table=pd.DataFrame(rows), chosen=gr.update(choices=choices)))

    def show(self, sweep_id: str | None) -> tuple:
        """A stored sweep's figure, its points, and its sweep.json, sweep.csv and report to download."""
        if not sweep_id:
            return parts(skipped(Points)) + parts(Files(json=None, csv=None, report=None))
        sweep = load_sweep(self.host.db_path, sweep_id)
        paths = write_sweep(sweep, tempfile.mkdtemp(prefix="kvlab-sweep-"))
        report = write_report(str(paths["json"].parent), paths["json"].parent / f"report-{sweep_id}.html")
        return parts(points_view(sweep)) + parts(Files(json=str(paths["json"]), csv=str(paths["csv"]),
                                                       report=str(report)))


@dataclass
class Points(Generic[T]):
    """A sweep's points by name: their figure, what the lab reads from them, one row per finished value."""

    figure: T
    caption: T
    table: T


@dataclass
class SweepForm(Generic[T]):
    """The Sweeps form by field name (the declared order is SweepHandlers.start's, and the start_sweep API's)."""

    knob: T
    values: T
    users: T
    workload: T
    requests_per_user: T
    output_len: T


@dataclass
class Stored(Generic[T]):
    """The stored sweeps by name: their table and the choices of the dropdown that shows one."""

    table: T
    chosen: T


@dataclass
class Files(Generic[T]):
    """A stored sweep's files by name: sweep.json, sweep.csv and its report."""

    json: T
    csv: T
    report: T


def points_view(sweep: dict) -> Points:
    """A sweep's (live, or stored: sweep.json's dict) figure, computed answer and table."""
    return Points(figure=sweep_figure(sweep), caption=answer_text(sweep),
                  table=pd.DataFrame(sweep["points"]).round(3))


def answer_text(sweep: dict) -> str:
    """What the lab says about the sweep's points (lab.sweeps.words.sweep_answer), as a list; empty while it has
    none."""
    return "\n".join(f"- {line}" for line in sweep_answer(sweep))


@dataclass
class SweepTab:
    """The Sweeps tab's components."""

    form: SweepForm
    run: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    progress: gr.Markdown
    points: Points
    stored: Stored
    files: Files  # of the chosen one
    estimate: gr.Markdown | None = None  # how long Run sweep would take here (lab.estimate)


def build_sweep_tab(host: Host, ticker: Ticker, guard: Guard) -> SweepTab:
    """Lay out the Sweeps tab (call inside gr.Tabs) and wire it to ``host`` (Run and Cancel behind ``guard``)."""
    handlers = SweepHandlers(host)
    with gr.Tab("Sweeps", id="sweeps"):
        tab = _layout(handlers, guard)
        _wire(handlers, tab, ticker, guard)
    return tab


def _layout(handlers: SweepHandlers, guard: Guard) -> SweepTab:
    """The form, Run and Cancel (under ``guard``'s rule), the message and progress lines, the figure, the points,
    the stored sweeps."""
    gr.Markdown(INTRO)
    with gr.Row():
        knob = gr.Dropdown([(f"{k} ({engine})", k) for k, engine in KNOBS.items()], value=DEFAULT_KNOB,
                           label="Knob (engine)", elem_id="sweep-knob",
                           allow_custom_value=True)  # an API's unknown name: the lab's message, not Gradio's
        values = gr.Textbox(handlers.values_for(DEFAULT_KNOB), label="Values (comma list)", elem_id="sweep-values")
        users = gr.Textbox("5", label="Concurrent users (comma list)", elem_id="sweep-users")
    with gr.Row():
        workload = gr.Dropdown(list(WORKLOADS), value="mixed", label="Workload", allow_custom_value=True)
        requests = gr.Number(2, label="Requests per user", elem_id="sweep-requests")
        output_len = gr.Number(0, label="Output length (0 = the workload's)", elem_id="sweep-output-len")
    with gr.Row():
        run = gr.Button("Run sweep", variant="primary", elem_id="sweep-run", interactive=False)  # set by the timer
        cancel = gr.Button("Cancel", variant="stop", elem_id="sweep-cancel", interactive=False)
    guard.gate(START, run)
    guard.gate(CANCEL, cancel)
    guard.note("Run sweep and Cancel", "sweep-watch")
    form = SweepForm(knob=knob, values=values, users=users, workload=workload, requests_per_user=requests,
                     output_len=output_len)
    estimate = gr.Markdown(lambda: handlers.estimate(*(box.value for box in parts(form))), elem_id="sweep-estimate")
    message = gr.Markdown(elem_id="sweep-message")
    progress = gr.Markdown(sweep_progress(None), elem_id="sweep-progress")
    figure = gr.Plot(sweep_figure({}), label="Measured against the knob", elem_id="sweep-figure")
    answer = gr.Markdown(elem_id="sweep-answer")
    table = gr.Dataframe(label="One row per finished value (as sweep.csv)", elem_id="sweep-points")
    stored = gr.Dataframe(label="Stored sweeps (kept as each value finishes, partial ones too)",
                          elem_id="sweep-stored")
    chosen = gr.Dropdown([], label="Show a stored sweep (its figure and points above, its files here)",
                         elem_id="sweep-chosen")
    with gr.Row():
        files = Files(json=gr.File(label="sweep.json"), csv=gr.File(label="sweep.csv"),
                      report=gr.File(label="report (one HTML file, opens offline)", elem_id="sweep-report"))
    return SweepTab(form=form, estimate=estimate, run=run, cancel=cancel, message=message, progress=progress,
                    points=Points(figure=figure, caption=answer, table=table),
                    stored=Stored(table=stored, chosen=chosen), files=files)


def _wire(handlers: SweepHandlers, tab: SweepTab, ticker: Ticker, guard: Guard) -> None:
    """Buttons and the knob; then a timer whose keys gate the progress line, the points and the stored list."""
    form = parts(tab.form)
    tab.form.knob.change(handlers.values_for, [tab.form.knob], [tab.form.values], api_visibility="private",
                         show_progress="hidden")
    for box in form:  # the knob's change sets its values, whose change redraws the estimate
        box.change(handlers.estimate, form, [tab.estimate], queue=False, api_visibility="private",
                   show_progress="hidden")
    guard.started(tab.run.click(guard(handlers.start, "Starting a sweep"), form, [tab.message],
                                api_name="start_sweep", show_progress="hidden"))
    tab.cancel.click(guard(handlers.host.cancel, "Cancelling"), None, [tab.message], api_name="cancel_sweep",
                     show_progress="hidden")
    tab.stored.chosen.change(handlers.show, [tab.stored.chosen], parts(tab.points) + parts(tab.files),
                             api_visibility="private", show_progress="hidden")
    groups = [(handlers.progress_key, handlers.progress, [tab.progress]),
              (handlers.points_key, handlers.points, parts(tab.points)),
              (handlers.ended_key, handlers.stored, parts(tab.stored))]
    ticker.add(groups)
