"""The "Why" tab: the HF-to-vLLM ratio taken apart (the why ladder, lab.experiments.why), run from the page.

Pure helpers first (the progress line; the factors table is lab.plots.why's), then WhyHandlers over one Host, then
the layout and its wiring. A ladder runs as the host's experiment ("why"): one task at a time, cancel keeps the
turns measured, and it is stored with the other experiments; the tab lists the stored ladders, each with its report
(lab.report) to download. As in lab/app/ui_kv.py, the page's one gr.Timer writes a cheap change key and the figure,
caption and table are redrawn only when it moved. Before this app's first ladder the tab shows the newest stored
one, from the page's first frame (lab.app.ui_frame).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Generic

import gradio as gr

from lab.app.dashboard import T, TaskView, parts
from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker, current_experiment, run_cancel_lines, skipped, start_task
from lab.config import whole
from lab.estimate import experiment_line
from lab.experiments import ExperimentPlan, parse_params
from lab.experiments.ladder import RUNGS
from lab.experiments.why import LEVELS, PRESET_WORDS, PRESETS
from lab.plots.why import factors_table, fields_figure, ladder_figure
from lab.report import write_report
from lab.status import RunStatus
from lab.store import list_experiments

NO_LADDER = "No ladder yet: choose a preset and press **Run**."
INTRO = ("The lab holds every contender, so it can take its own ratio apart. Each rung changes one mechanism and "
         "runs the same seeded requests; the rungs take turns, repeat after repeat, at each user level. The chain "
         "follows what a request meets: how requests are batched (hf → hf-cb), whose engine schedules them "
         "(→ vllm-hf-code: vLLM's engine on transformers' model code), whose model code and kernels run a step "
         "(→ vllm-eager), what a step costs the CPU (→ vllm-compiled, → vllm: torch.compile, CUDA graphs). A step's "
         "factor is its rung's tok/s over the rung below, and the chain's steps multiply to vLLM / HF. Side rungs "
         "(HF compiled, vLLM's step loop, offline vLLM) are set against one chain rung, outside the product. A rung "
         "the device cannot run is skipped with the reason and its step merges with the next. Run at several user "
         "levels, the figure shows how each factor moves with users. The sentences under the figure are computed "
         "from the run.")


# -- pure helpers ------------------------------------------------------------------------------------
def ladder_progress(result) -> str:
    """One line: the ladder's preset, status and message."""
    if result is None:
        return NO_LADDER
    preset = result.fields.get("preset", getattr(result.params, "preset", ""))
    return f"Ladder **{preset}** ({result.id}): status {result.status}: {result.message}"


def stored_progress(data: dict) -> str:
    """The line of a stored ladder shown before this app ran one."""
    when = data["started_at"].replace("T", " ")[:16]
    return (f"Last ladder **{data.get('preset', '?')}** ({data['experiment_id']}, {data['status']}, {when} UTC), "
            "stored: the others are under *Stored ladders*.")


# -- handlers ----------------------------------------------------------------------------------------
class WhyHandlers:
    """The tab's event handlers over one Host."""

    def __init__(self, host: Host):
        self.host = host

    def start(self, preset: str, repeats, rungs: str, users: str = "") -> str:
        """Start a ladder; returns the message line."""
        return start_task(self.host, lambda: ExperimentPlan("why", self.params(preset, repeats, rungs, users)))

    def params(self, preset: str, repeats, rungs: str, users: str = ""):
        """The ladder's Params from the form (ValueError naming a bad value)."""
        return parse_params("why", {"preset": preset, "repeats": whole(repeats, "repeats"),
                                    "rungs": rungs or ",".join(RUNGS), "users": (users or "").strip()})

    def estimate(self, preset: str, repeats, rungs: str, users: str = "") -> str:
        """How long the ladder would take here (lab.estimate: the stored ladders of these settings)."""
        return experiment_line(self.host, "why", lambda: self.params(preset, repeats, rungs, users))

    def cancel(self) -> str:
        return self.host.cancel()

    def ladder(self):
        """The host's experiment when it is a ladder, else None."""
        return current_experiment(self.host, "why")

    def result_key(self) -> tuple | None:
        result = self.ladder()
        if result is None:
            return None
        return result.id, str(result.status), result.message, len(result.rows)

    def ended_key(self) -> tuple | None:
        """Changes when a ladder starts and when it ends (the stored list grows then)."""
        result = self.ladder()
        return None if result is None else (result.id, result.status == RunStatus.RUNNING)

    def result_view(self) -> tuple:
        """The progress line, the figure, the computed caption and the factors: of this app's ladder, else of the
        newest stored one."""
        result = self.ladder()
        if result is not None:
            return parts(TaskView(progress=ladder_progress(result), figure=ladder_figure(result),
                                  caption=result.fields.get("caption", ""), table=factors_table(result.fields)))
        found = list_experiments(self.host.db_path, "why")
        if not found:
            return parts(skipped(TaskView, progress=NO_LADDER))
        return parts(TaskView(progress=stored_progress(found[0]), figure=fields_figure(found[0]),
                              caption=found[0].get("caption", ""), table=factors_table(found[0])))

    def stored(self):
        """The stored ladders, newest first, as the dropdown's choices."""
        found = list_experiments(self.host.db_path, "why")
        return gr.update(choices=[(f"{d['started_at'].replace('T', ' ')[:16]} · {d.get('preset', '?')} · "
                                   f"{d['status']} ({d['experiment_id']})", d["experiment_id"]) for d in found])

    def show_stored(self, experiment_id: str | None) -> tuple:
        """A stored ladder's figure, caption and factors, and its report to download."""
        data = next((d for d in list_experiments(self.host.db_path, "why") if d["experiment_id"] == experiment_id),
                    None)
        if data is None:
            return gr.skip(), "No such stored ladder.", gr.skip(), None
        report = Path(tempfile.mkdtemp(prefix="kvlab-why-")) / f"report-{experiment_id}.html"
        return (fields_figure(data), data.get("caption", ""), factors_table(data),
                str(write_report(experiment_id, report, self.host.db_path)))


# -- layout and wiring -------------------------------------------------------------------------------
@dataclass
class LadderForm(Generic[T]):
    """The Why form by field name (the declared order is WhyHandlers.start's, and the start_ladder API's)."""

    preset: T
    repeats: T
    rungs: T
    users: T


@dataclass
class WhyTab:
    """The Why tab's components."""

    run: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    result: TaskView  # progress, figure, caption, factors


def build_why_tab(host: Host, ticker: Ticker, guard: Guard) -> WhyTab:
    """Lay out the Why tab (call inside gr.Tabs) and wire it to ``host`` (Run and Cancel behind ``guard``)."""
    handlers = WhyHandlers(host)
    with gr.Tab("Why", id="why"):
        gr.Markdown(INTRO)
        with gr.Row():
            preset = gr.Dropdown([(f"{name}: {PRESET_WORDS[name]}", name) for name in PRESETS], value="spread",
                                 label="Preset (the load every rung runs)", elem_id="why-preset", scale=3,
                                 allow_custom_value=True)  # an API's unknown name: the lab's message, not Gradio's
            repeats = gr.Number(3, label="Repeats (turns of every rung)", precision=None, elem_id="why-repeats",
                                scale=1)
        with gr.Row():
            rungs = gr.Textbox(",".join(RUNGS), label="Rungs (comma list; hf and vllm at least)", elem_id="why-rungs",
                               scale=3)
            users = gr.Textbox(LEVELS.get(host.check.device, LEVELS["cpu"]), elem_id="why-users", scale=1,
                               label="Users (the whole ladder at each level; empty: the preset's own)")
        run, cancel, message, progress = run_cancel_lines("why", NO_LADDER, guard)
        form = parts(LadderForm(preset=preset, repeats=repeats, rungs=rungs, users=users))
        estimate = gr.Markdown(lambda: handlers.estimate(*(box.value for box in form)), elem_id="why-estimate")
        figure = gr.Plot(label="Output tok/s per rung (measured)", elem_id="why-figure")
        caption = gr.Markdown(elem_id="why-caption")
        factors = gr.DataFrame(label="Factors", elem_id="why-factors", wrap=True)
        with gr.Row():
            stored = gr.Dropdown([], label="Stored ladders", elem_id="why-stored", scale=3)
            refresh = gr.Button("Refresh", size="sm", scale=1)
        report = gr.File(label="The stored ladder's report (one HTML file, opens offline)", elem_id="why-report")
        tab = WhyTab(run=run, cancel=cancel, message=message, result=TaskView(progress=progress, figure=figure,
                                                                         caption=caption, table=factors))
    guard.started(run.click(guard(handlers.start, "Starting a ladder"), form, [message],
                            api_name="start_ladder", show_progress="hidden"))
    cancel.click(guard(handlers.cancel, "Cancelling"), None, [message], api_name="cancel_ladder",
                 show_progress="hidden")
    refresh.click(handlers.stored, None, [stored], api_visibility="private", show_progress="hidden")
    for box in form:
        box.change(handlers.estimate, form, [estimate], queue=False, api_visibility="private", show_progress="hidden")
    stored.change(handlers.show_stored, [stored], [figure, caption, factors, report], api_visibility="private",
                  show_progress="hidden")
    ticker.add([(handlers.result_key, handlers.result_view, parts(tab.result)),
                (handlers.ended_key, handlers.stored, [stored])])
    return tab
