"""The "KV cache" tab: run one KV-cache experiment (lab.experiments) from the page and watch it.

Pure helpers first (the parameter text -> a dict of strings, the hint under it, the progress line, the
fields shown), then KvHandlers (small named handlers over one Host), then the layout and its wiring.
As in lab/app/ui.py, the page's one gr.Timer (ui_timer.Ticker) writes the tab's cheap change keys into gr.State
once a second and each group of components is redrawn only when its own key changed: the live block picture while an
experiment's load run goes, and the progress line, figure and fields when the experiment's state moves. A ``table``
result gets a step slider (and Play, a timer of the page's own that moves it) over vLLM's block table: each step
redraws the figure and its one sentence for that page alone. Every figure comes from lab.plots.kv, the functions
the notebooks use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Generic

import gradio as gr

from lab.app.dashboard import T, TaskView, parts
from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker, run_cancel_lines, skipped, start_task
from lab.estimate import experiment_line
from lab.experiments import EXPERIMENTS, OWN_TAB, ExperimentPlan, module, parse_pairs, parse_params, stored_fields
from lab.experiments.answers import experiment_answer
from lab.experiments.table import default_step
from lab.plots.kv import block_table_view, experiment_figure, live_blocks_figure
from lab.status import RunStatus

DEFAULT_EXPERIMENT = "blocks"
NO_EXPERIMENT = "No experiment yet: choose one, set its parameters and press **Run**."
PLAY_S, PLAY_FRAMES = 0.5, 40  # Play moves the step slider every PLAY_S, through the run in about PLAY_FRAMES moves
PAIRS_HELP = ("Write `key=value` pairs separated by spaces; a comma belongs to its value, so a list has no "
              "spaces in it (`users=1,5`). A parameter left out keeps its default.")


# -- pure helpers ------------------------------------------------------------------------------------
def params_hint(name: str) -> str:
    """The experiment's parameter names and defaults (from its Params dataclass) and what they mean."""
    params_cls = module(name).Params
    defaults = " ".join(_default_pair(f) for f in dataclasses.fields(params_cls))
    meaning = " ".join((params_cls.__doc__ or "").split())
    return f"**{name}** takes (defaults): {defaults}  \n{meaning}  \n{PAIRS_HELP}"


def _default_pair(f: dataclasses.Field) -> str:
    """``key=default`` as a user would write it (a tuple as 1,5; no default value as 'none')."""
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if value is None:
        return f"`{f.name}` (none)"
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    return f"`{f.name}={value}`"


def experiment_progress(result) -> str:
    """One line: which experiment, its status and its own message."""
    if result is None:
        return NO_EXPERIMENT
    return f"Experiment **{result.experiment}** ({result.id}): status {result.status}: {result.message}"


def shown_fields(result) -> dict:
    """The experiment as experiment.json holds it, less its figure's series (plain JSON types); what it
    measured comes right after its name and status, before params, device and versions."""
    data = {k: v for k, v in result.to_dict().items() if k != "series"}
    first = ["experiment", "experiment_id", "status", "error", *result.fields]
    ordered = {k: data[k] for k in first if k in data} | data
    return json.loads(json.dumps(ordered, default=str))


def answer_text(result) -> str:
    """What the lab reads from the result: lab.experiments.answers' lines for its experiment, from its fields as
    experiment.json holds them (the report's words); empty where it has none yet."""
    data = shown_fields(result)
    lines = experiment_answer(result.experiment, stored_fields(data), data.get("params") or {})
    return "\n".join(f"- {line}" for line in lines)


# -- handlers ----------------------------------------------------------------------------------------
class KvHandlers:
    """The tab's event handlers over one Host: actions, change keys and the redraws they gate."""

    def __init__(self, host: Host):
        self.host = host

    # actions
    def start(self, name: str, text: str) -> str:
        """Start the chosen experiment with the typed parameters; returns the message line."""
        return start_task(self.host, lambda: ExperimentPlan(name, parse_params(name, parse_pairs(text or ""))))

    def estimate(self, name: str, text: str) -> str:
        """How long the experiment would take here (lab.estimate: the stored ones of these parameters)."""
        return experiment_line(self.host, name, lambda: parse_params(name, parse_pairs(text or "")))

    def cancel(self) -> str:
        """Cancel what is running (an experiment, or a load-test run); returns the message line."""
        return self.host.cancel()

    # change keys: cheap, read every tick
    def live_key(self) -> tuple | None:
        """Changes with every update while an experiment's load run goes; once more when it ends."""
        result = self.host.last("experiment")
        if result is None:
            return None
        if result.status == RunStatus.RUNNING and result.run is not None:
            return result.id, self.host.version
        return result.id, str(result.status), result.run is not None

    def result_key(self) -> tuple | None:
        """Changes when the experiment's status, message, fields or series change."""
        result = self.host.last("experiment")
        if result is None:
            return None
        return (result.id, str(result.status), result.message, len(result.fields),
                sum(len(s) for s in result.series.values()))

    # redraws
    def live_blocks(self):
        """vLLM's KV blocks per request (or HF's slab while HF runs), drawn now."""
        return live_blocks_figure(self.host.last("experiment"))

    def result_view(self) -> tuple:
        """The progress line, the experiment's figure, what the lab reads from it and its fields."""
        result = self.host.last("experiment")
        if result is None:
            return parts(skipped(TaskView, progress=NO_EXPERIMENT))
        return parts(TaskView(progress=experiment_progress(result), figure=experiment_figure(result),
                              caption=answer_text(result), table=shown_fields(result)))

    # the block table of a table result, step by step
    def _table_steps(self) -> list:
        """The engine steps of the host's table result (none for another experiment, or before its engine ran)."""
        result = self.host.last("experiment")
        return result.series.get("steps", []) if result is not None and result.experiment == "table" else []

    def table_key(self) -> tuple | None:
        """Changes when a table result comes, or its steps do."""
        steps = self._table_steps()
        return (self.host.last("experiment").id, len(steps)) if steps else None

    def table_controls(self) -> list:
        """The step slider (at the step where most requests held one block at once), Play, the sentence and the
        figure of that step; the slider and Play hidden where there is no block table to step through."""
        steps = self._table_steps()
        if not steps:
            return parts(skipped(BlockTable, step=gr.update(visible=False), play=gr.update(visible=False),
                                 sentence=""))
        step = default_step(steps)
        figure, said = block_table_view(self.host.last("experiment"), step)
        slider = gr.update(minimum=0, maximum=len(steps) - 1, value=step, visible=True)
        return parts(BlockTable(step=slider, play=gr.update(visible=True), sentence=said, figure=figure))

    def table_at(self, step: float) -> tuple:
        """The sentence and the figure of the block table after ``step`` (the slider's value)."""
        steps = self._table_steps()
        if not steps:
            return gr.skip(), gr.skip()
        figure, said = block_table_view(self.host.last("experiment"), min(int(step), len(steps) - 1))
        return said, figure

    def play(self, playing: bool, step: float) -> tuple:
        """Play or pause: (playing, the play timer, the button's label, the slider: back to 0 when at the end)."""
        last = len(self._table_steps()) - 1
        start = not playing and last > 0
        value = 0 if start and step >= last else gr.skip()
        return start, gr.update(active=start), "Pause" if start else "Play", value

    def advance(self, playing: bool, step: float) -> tuple:
        """One move of Play: the slider a few steps on; stopped at the last step (playing, timer, label, slider).
        A tick that comes after Pause moves nothing."""
        last = len(self._table_steps()) - 1
        if not playing or last < 1:
            return False, gr.update(active=False), "Play", gr.skip()
        nxt = min(last, int(step) + max(1, last // PLAY_FRAMES))
        if nxt < last:
            return gr.skip(), gr.skip(), gr.skip(), nxt
        return False, gr.update(active=False), "Play", nxt


# -- layout and wiring -------------------------------------------------------------------------------
@dataclass
class BlockTable(Generic[T]):
    """A table result's controls by name: the step slider, Play, the step's sentence and its figure."""

    step: T
    play: T
    sentence: T
    figure: T


@dataclass
class KvTab:
    """The KV cache tab's components."""

    experiment: gr.Dropdown
    params: gr.Textbox
    hint: gr.Markdown
    run: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    live: gr.Plot
    result: TaskView  # progress line, figure, answer, fields
    table: BlockTable
    playing: gr.State
    player: gr.Timer
    estimate: gr.Markdown | None = None  # how long Run would take here (lab.estimate)


def build_kv_tab(host: Host, ticker: Ticker, guard: Guard) -> KvTab:
    """Lay out the KV cache tab (call inside gr.Tabs) and wire it to ``host``.

    Args:
        host: The engine host.
        ticker: The page's timer, which its redraws join.
        guard: The presenter rule its Run and Cancel go through.

    Returns:
        The tab's components.
    """
    handlers = KvHandlers(host)
    with gr.Tab("KV cache", id="kv"):
        tab = _layout(guard, handlers)
        _wire(handlers, tab, ticker, guard)
    return tab


def _layout(guard: Guard, handlers: KvHandlers) -> KvTab:
    """The form, Run and Cancel, the message and progress lines, the live picture, a table result's step slider
    and Play with the step's sentence, then the experiment's figure, what the lab reads from it and its fields."""
    gr.Markdown("Each experiment measures one reason paged KV wins, on the engines loaded above.")
    with gr.Row():
        choices = [(f"{name}: {text}", name) for name, text in EXPERIMENTS.items() if name not in OWN_TAB]
        experiment = gr.Dropdown(choices,
                                 value=DEFAULT_EXPERIMENT, label="Experiment", elem_id="kv-experiment", scale=2)
        params = gr.Textbox("", label="Parameters", placeholder="users=4 output_len=24", elem_id="kv-params",
                            scale=1)
    hint = gr.Markdown(params_hint(DEFAULT_EXPERIMENT), elem_id="kv-params-hint")
    run, cancel, message, progress = run_cancel_lines("kv", NO_EXPERIMENT, guard)
    estimate = gr.Markdown(lambda: handlers.estimate(DEFAULT_EXPERIMENT, ""), elem_id="kv-estimate")
    live = gr.Plot(live_blocks_figure(None), label="KV blocks, live (vLLM's pool per request, or HF's slab while HF "
                   "runs)", elem_id="kv-live")
    with gr.Row(equal_height=True):
        step = gr.Slider(0, 1, value=0, step=1, label="Engine step (vLLM's block table after it)", visible=False,
                         elem_id="kv-table-step", scale=6)
        play = gr.Button("Play", visible=False, elem_id="kv-table-play", scale=0, min_width=90)
    sentence = gr.Markdown(elem_id="kv-table-sentence")
    figure = gr.Plot(label="The experiment's figure", elem_id="kv-figure")
    answer = gr.Markdown(elem_id="kv-answer")
    fields = gr.JSON(label="Measured (experiment.json without its series)", elem_id="kv-fields", max_height=450)
    return KvTab(experiment=experiment, params=params, hint=hint, run=run, cancel=cancel, message=message,
                 live=live, result=TaskView(progress=progress, figure=figure, caption=answer, table=fields),
                 table=BlockTable(step=step, play=play, sentence=sentence, figure=figure),
                 playing=gr.State(False), player=gr.Timer(PLAY_S, active=False), estimate=estimate)


def _wire(handlers: KvHandlers, tab: KvTab, ticker: Ticker, guard: Guard) -> None:
    """Buttons and the dropdown; then a timer whose keys gate the live picture and the result."""
    tab.experiment.change(params_hint, [tab.experiment], [tab.hint], api_visibility="private", show_progress="hidden")
    for box in (tab.experiment, tab.params):
        box.change(handlers.estimate, [tab.experiment, tab.params], [tab.estimate], queue=False,
                   api_visibility="private", show_progress="hidden")
    guard.started(tab.run.click(guard(handlers.start, "Starting an experiment"), [tab.experiment, tab.params],
                                [tab.message], api_name="start_experiment", show_progress="hidden"))
    tab.cancel.click(guard(handlers.cancel, "Cancelling"), None, [tab.message], api_name="cancel_experiment",
        show_progress="hidden")
    _wire_table(handlers, tab)
    groups = [(handlers.live_key, handlers.live_blocks, [tab.live]),
              (handlers.result_key, handlers.result_view, parts(tab.result)),
              (handlers.table_key, handlers.table_controls, parts(tab.table))]
    ticker.add(groups)


def _wire_table(handlers: KvHandlers, tab: KvTab) -> None:
    """The step slider redraws the sentence and figure of its step (whoever moved it: a hand, Play or a new
    result); Play starts and pauses the page's own timer, which moves the slider."""
    step, play, sentence, figure = parts(tab.table)
    quiet = {"api_visibility": "private", "show_progress": "hidden"}
    step.change(handlers.table_at, [step], [sentence, figure], **quiet)
    play.click(handlers.play, [tab.playing, step], [tab.playing, tab.player, play, step], **quiet)
    tab.player.tick(handlers.advance, [tab.playing, step], [tab.playing, tab.player, play, step], **quiet)
