"""The one wiring every tab uses: a gr.Timer writes change keys into gr.State, and redraws hang off them; and a
task tab's Run, Cancel, message and progress lines.

As in trackio: every tick reads a cheap key per group of components (a status string, an id and a count);
a group is redrawn only when its own key changed (the State's change event), so a quiet page costs a few
attribute reads a second and no figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import gradio as gr

Group = tuple  # (key, redraw, the components redraw returns[, the components redraw reads])


def redraw_on_change(groups: Sequence[Group], tick_s: float, quiet: dict) -> None:
    """Wire one timer for ``groups`` (call inside the Blocks)."""
    keys = [gr.State(None) for _ in groups]
    # queued: only a queued event reports which States it changed, and so fires their change events
    gr.Timer(tick_s).tick(lambda: [group[0]() for group in groups], None, keys, **quiet)
    for state, (_, redraw, outputs, *inputs) in zip(keys, groups, strict=True):
        state.change(redraw, inputs[0] if inputs else None, outputs, queue=False, **quiet)


def run_cancel_lines(prefix: str, idle: str) -> tuple:
    """A task tab's Run and Cancel (pressable as the page timer says), its message line and its progress line
    (``idle`` until a task of its kind exists); element ids PREFIX-run, -cancel, -message, -progress."""
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id=f"{prefix}-run", interactive=False)
        cancel = gr.Button("Cancel", variant="stop", elem_id=f"{prefix}-cancel", interactive=False)
    return run, cancel, gr.Markdown(elem_id=f"{prefix}-message"), gr.Markdown(idle, elem_id=f"{prefix}-progress")
