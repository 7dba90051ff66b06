"""The "KV cache" tab: run one KV-cache experiment (lab.experiments) from the page and watch it.

Pure helpers first (the parameter text -> a dict of strings, the hint under it, the progress line, the
fields shown), then KvHandlers (small named handlers over one Host), then the layout and its wiring.
As in lab/app/ui.py, the page's one gr.Timer (ui_timer.Ticker) writes the tab's cheap change keys into gr.State
once a second and each group of components is redrawn only when its own key changed: the live block picture while an
experiment's load run goes, and the progress line, figure and fields when the experiment's state moves.
Every figure comes from lab.plots_kv, the functions the notebooks use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import gradio as gr

from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker, run_cancel_lines, start_experiment
from lab.experiments import EXPERIMENTS, OWN_TAB, module, parse_pairs, parse_params
from lab.plots_kv import experiment_figure, live_blocks_figure
from lab.status import RunStatus

DEFAULT_EXPERIMENT = "blocks"
NO_EXPERIMENT = "No experiment yet: choose one, set its parameters and press **Run**."
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


# -- handlers ----------------------------------------------------------------------------------------
class KvHandlers:
    """The tab's event handlers over one Host: actions, change keys and the redraws they gate."""

    def __init__(self, host: Host):
        self.host = host

    # actions
    def start(self, name: str, text: str) -> str:
        """Start the chosen experiment with the typed parameters; returns the message line."""
        return start_experiment(self.host, name, lambda: parse_params(name, parse_pairs(text or "")))

    def cancel(self) -> str:
        """Cancel what is running (an experiment, or a load-test run); returns the message line."""
        return self.host.cancel()

    # change keys: cheap, read every tick
    def live_key(self) -> tuple | None:
        """Changes with every update while an experiment's load run goes; once more when it ends."""
        result = self.host.experiment
        if result is None:
            return None
        if result.status == RunStatus.RUNNING and result.run is not None:
            return result.id, self.host.version
        return result.id, str(result.status), result.run is not None

    def result_key(self) -> tuple | None:
        """Changes when the experiment's status, message, fields or series change."""
        result = self.host.experiment
        if result is None:
            return None
        return (result.id, str(result.status), result.message, len(result.fields),
                sum(len(s) for s in result.series.values()))

    # redraws
    def live_blocks(self):
        """vLLM's KV blocks per request (or HF's slab while HF runs), drawn now."""
        return live_blocks_figure(self.host.experiment)

    def result_view(self) -> tuple:
        """The progress line, the experiment's figure and its fields."""
        result = self.host.experiment
        if result is None:
            return NO_EXPERIMENT, gr.skip(), gr.skip()
        return experiment_progress(result), experiment_figure(result), shown_fields(result)


# -- layout and wiring -------------------------------------------------------------------------------
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
    result: list  # progress line, figure, fields: in KvHandlers.result_view's order


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
        tab = _layout()
        _wire(handlers, tab, ticker, guard)
    return tab


def _layout() -> KvTab:
    """The form, Run and Cancel, the message and progress lines, the live picture, then the
    experiment's figure beside its fields."""
    gr.Markdown("Each experiment measures one reason paged KV wins, on the engines loaded above.")
    with gr.Row():
        choices = [(f"{name}: {text}", name) for name, text in EXPERIMENTS.items() if name not in OWN_TAB]
        experiment = gr.Dropdown(choices,
                                 value=DEFAULT_EXPERIMENT, label="Experiment", elem_id="kv-experiment", scale=2)
        params = gr.Textbox("", label="Parameters", placeholder="users=4 output_len=24", elem_id="kv-params",
                            scale=1)
    hint = gr.Markdown(params_hint(DEFAULT_EXPERIMENT), elem_id="kv-params-hint")
    run, cancel, message, progress = run_cancel_lines("kv", NO_EXPERIMENT)
    live = gr.Plot(live_blocks_figure(None), label="KV blocks, live (vLLM's pool per request, or HF's slab while HF "
                   "runs)", elem_id="kv-live")
    with gr.Row():
        figure = gr.Plot(label="The experiment's figure", elem_id="kv-figure")
        fields = gr.JSON(label="Measured (experiment.json without its series)", elem_id="kv-fields",
                         max_height=450)
    return KvTab(experiment=experiment, params=params, hint=hint, run=run, cancel=cancel, message=message,
                 live=live, result=[progress, figure, fields])


def _wire(handlers: KvHandlers, tab: KvTab, ticker: Ticker, guard: Guard) -> None:
    """Buttons and the dropdown; then a timer whose keys gate the live picture and the result."""
    tab.experiment.change(params_hint, [tab.experiment], [tab.hint], api_visibility="private", show_progress="hidden")
    tab.run.click(guard(handlers.start, "Starting an experiment"), [tab.experiment, tab.params], [tab.message],
                  api_name="start_experiment", show_progress="hidden")
    tab.cancel.click(guard(handlers.cancel, "Cancelling"), None, [tab.message], api_name="cancel_experiment",
        show_progress="hidden")
    groups = [(handlers.live_key, handlers.live_blocks, [tab.live]),
              (handlers.result_key, handlers.result_view, tab.result)]
    ticker.add(groups)
