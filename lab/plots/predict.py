"""The room's predictions against the measured answer: a histogram of the predicted ratios (log bins, as guesses
span decades) with the measured ratio as a solid line and the room's median dotted; for a ladder, how many chose
each step, the measured largest step in its own colour. Every number drawn comes from the round
(lab.predictions)."""

from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go

from lab.plots import _layout
from lab.predictions import RATIO, TASKS, histogram, step_counts, times

ROOM_COLOR, MEASURED_COLOR, MEDIAN_COLOR = "#a5668b", "#17bebb", "#2a3f5f"
NONE_YET = "no predictions"


def room_figure(view: dict) -> go.Figure:
    """The figure of an ended round (its ``view``): the room's answers and the measured one."""
    title = f"The room's predictions and the measured answer ({TASKS[view['kind']]} {view['task_id']})"
    if view["kind"] == RATIO:
        return _layout(ratio_bars(view["values"], view["measured"]), title, "predicted vLLM/HF (log scale)",
                       "predictions", NONE_YET)
    return _layout(step_bars(view["values"], view["choices"], view["measured"]), title, "largest step",
                   "predictions", NONE_YET)


def ratio_bars(values: list[float], measured: float | None) -> go.Figure:
    """Each bin's count over its span of log10(ratio), ticks at the bin edges named as ratios; the measured ratio
    and the median as vertical lines."""
    fig = go.Figure()
    bins = histogram(values, measured)
    if not bins:
        return fig
    lows, highs = [math.log10(b.low) for b in bins], [math.log10(b.high) for b in bins]
    fig.add_trace(go.Bar(x=[(lo + hi) / 2 for lo, hi in zip(lows, highs, strict=True)], y=[b.count for b in bins],
                         width=[hi - lo for lo, hi in zip(lows, highs, strict=True)], marker_color=ROOM_COLOR,
                         marker_line=dict(color="white", width=1),
                         name="predictions", customdata=[f"{times(b.low)}-{times(b.high)}" for b in bins],
                         hovertemplate="%{customdata}: %{y}<extra></extra>"))
    edges = lows + highs[-1:]
    step = max(1, len(edges) // 6)  # at most ~7 tick labels
    fig.update_xaxes(tickvals=edges[::step], ticktext=[times(10 ** e) for e in edges[::step]], rangemode="normal")
    fig.add_vline(math.log10(statistics.median(values)), line_dash="dot", line_width=2, line_color=MEDIAN_COLOR,
                  annotation_text=f"room's median {times(statistics.median(values))}", annotation_position="top left")
    if measured:
        fig.add_vline(math.log10(measured), line_width=3, line_color=MEASURED_COLOR,
                      annotation_text=f"measured {times(measured)}", annotation_position="top right")
    fig.update_yaxes(dtick=1, range=[0, 1.3 * max(b.count for b in bins)])  # room above the bars for the labels
    return fig


def step_bars(values: list[str], choices: list[str], measured: str | None) -> go.Figure:
    """How many chose each step; the measured largest step in its own colour and named over its bar."""
    counts = step_counts(values, [*choices, *([measured] if measured and measured not in choices else [])])
    fig = go.Figure()
    if not values:
        return fig
    fig.add_trace(go.Bar(x=list(counts), y=list(counts.values()), name="predictions",
                         marker_color=[MEASURED_COLOR if step == measured else ROOM_COLOR for step in counts],
                         text=["measured largest" if step == measured else "" for step in counts],
                         textposition="outside"))
    fig.update_xaxes(type="category")
    fig.update_yaxes(dtick=1)
    return fig
