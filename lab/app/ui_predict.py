"""The "Predict" tab: the room predicts the next run's headline, then sees its answers against the measured one.

The presenter opens predictions for the next load test (its vLLM/HF ratio at the top user level) or the next Why
ladder (its largest step) and may close them; the round closes by itself as that task starts and goes with it
(lab.predictions; the host keeps it, lab.app.host). Every page, an attendee's too, may answer once (a new answer
replaces its last), keyed by the page's session: anonymous. Until the task ends a page shows how many answered,
never what; then every page shows the histogram, the measured answer and the computed sentence. As on the other
tabs, the page's one gr.Timer writes a cheap key and the redraw, shared by every page, runs only when it moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic

import gradio as gr

from lab.app.access import COMMAND
from lab.app.dashboard import T, parts
from lab.app.seam import Host
from lab.app.ui_access import Guard
from lab.app.ui_timer import Ticker
from lab.plots.predict import room_figure
from lab.predictions import HIGHEST, LOWEST, QUESTIONS, RATIO, STEP, room_sentence, round_words

INTRO = ("**Predict, then measure.** Before a run, say what you expect; once it has ended, see the room's answers "
         "against what the lab measured. The presenter opens predictions for the next load test (its vLLM/HF output "
         "tok/s at the top user level) or the next Why ladder (which step is largest); each page gives one answer, "
         "anonymous, and sees the others' only once the run has ended.")
QUIET = {"show_progress": "hidden"}


class PredictHandlers:
    """The tab's event handlers over one Host."""

    def __init__(self, host: Host):
        self.host = host

    def predict(self, ratio, step, request: gr.Request) -> str:
        """Keep this page's answer (the ratio box's or the step's, as the round asks); the page's own line."""
        view = self.host.predictions()
        answer = step if view is not None and view["kind"] == STEP else ratio
        kept, words = self.host.predict(getattr(request, "session_hash", None) or "api", answer)
        if kept:
            return words
        return f"**Input error:** {words}" if words.startswith("Prediction:") else f"**Not taken:** {words}"

    def open(self, kind: str) -> str:
        opened, words = self.host.open_predictions(kind)
        return words if opened else f"**Input error:** {words}"

    def close(self) -> str:
        return self.host.close_predictions()

    def key(self) -> tuple | None:
        """Changes when a round opens, closes, gains an answer, goes with a task, or its task ends."""
        view = self.host.predictions()
        if view is None:
            return None
        return view["kind"], view["task_id"], view["open"], len(view["values"]), view["ended"]

    def view(self) -> tuple:
        """The round's line, the answer boxes (while it asks), and, once its task has ended, the figure and the
        sentence."""
        view = self.host.predictions()
        asking = view is not None and view["open"] and view["task_id"] is None
        ratio, step = asking and view["kind"] == RATIO, asking and view["kind"] == STEP
        ended = view is not None and view["ended"]
        return parts(RoomView(status=round_words(view), ratio=gr.update(visible=ratio),
                              step=gr.update(visible=step, choices=list(view["choices"]) if step else []),
                              send=gr.update(visible=asking), room=gr.update(visible=ended),
                              figure=room_figure(view) if ended else gr.skip(), sentence=room_sentence(view)))


@dataclass
class RoomView(Generic[T]):
    """The Predict tab's round by name: its line, the two answer boxes and Send (while it asks), the room's group,
    figure and sentence (once its task has ended)."""

    status: T
    ratio: T
    step: T
    send: T
    room: T
    figure: T
    sentence: T


@dataclass
class PredictTab:
    """The Predict tab's components."""

    shown: RoomView  # what PredictHandlers.view draws
    message: gr.Markdown  # this page's answer, or why it was not taken
    presenter: gr.Markdown  # the presenter's open / close line


def build_predict_tab(host: Host, ticker: Ticker, guard: Guard) -> PredictTab:
    """Lay out the Predict tab (call inside gr.Tabs) and wire it to ``host`` (Open and Close under ``guard``'s rule:
    the presenter's; Predict is every page's)."""
    handlers = PredictHandlers(host)
    with gr.Tab("Predict", id="predict"):
        gr.Markdown(INTRO)
        status = gr.Markdown(round_words(host.predictions()), elem_id="predict-status")
        with gr.Row(equal_height=False):
            ratio = gr.Number(None, label=f"Your prediction: vLLM/HF ({LOWEST:g} to {HIGHEST:g}; 3 means 3x faster)",
                              elem_id="predict-ratio", visible=False, scale=3)
            step = gr.Dropdown([], label="Your prediction: the largest step", elem_id="predict-step", visible=False,
                               scale=3)
            send = gr.Button("Predict", variant="primary", elem_id="predict-send", visible=False, scale=1,
                             min_width=120)
        message = gr.Markdown(elem_id="predict-message")
        with gr.Column(visible=False) as room:
            figure = gr.Plot(label="The room against the measured answer", elem_id="predict-figure")
        sentence = gr.Markdown(elem_id="predict-sentence")
        with gr.Accordion("Presenter: open and close predictions", open=False, elem_id="predict-presenter"):
            kind = gr.Radio([(QUESTIONS[RATIO], RATIO), (QUESTIONS[STEP], STEP)], value=RATIO,
                            label="Question", elem_id="predict-kind")
            with gr.Row():
                opened = gr.Button("Open predictions", elem_id="predict-open", size="sm", interactive=False)
                closed = gr.Button("Close predictions", elem_id="predict-close", size="sm", interactive=False)
            presenter = gr.Markdown(elem_id="predict-presenter-message")
    guard.gate(COMMAND, opened, closed)  # an attendee's page shows them disabled, the reason in the line under them
    guard.watch(presenter, "Open and Close predictions", own=True)
    shown = RoomView(status=status, ratio=ratio, step=step, send=send, room=room, figure=figure, sentence=sentence)
    tab = PredictTab(shown=shown, message=message, presenter=presenter)
    send.click(handlers.predict, [ratio, step], [message], api_name="predict", **QUIET)
    opened.click(guard(handlers.open, "Opening predictions"), [kind], [presenter], api_name="open_predictions",
                 **QUIET)
    closed.click(guard(handlers.close, "Closing predictions"), None, [presenter], api_name="close_predictions",
                 **QUIET)
    ticker.add([(handlers.key, handlers.view, parts(tab.shown))])
    return tab
