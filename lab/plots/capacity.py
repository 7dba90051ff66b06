"""The capacity search's figure and probe table (a capacity.json dict: a stored one, or a live search's
CapacityResult.to_dict()).

One panel per target: each engine's measured percentile at every level probed (a circle where the level met the
target, a cross where it missed; a level run twice shows both runs), the target's limit dashed, and each engine's
capacity (computed by the search from its verdicts) as a dotted vertical line. p95 TTFT and TPOT get a panel of
their own, with no limit, where no target bounds them. The level axis is logarithmic: the search doubles it.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.capacity import level_words, probe_rows
from lab.capacity.targets import seconds_words
from lab.capacity.words import target_label
from lab.engines import registry
from lab.plots import ENGINE_COLORS, _layout, empty_figure

TITLE = "Latency percentiles per probe (measured); dashed: the target; dotted: each engine's capacity (computed)"
NO_PROBE = "each probe's percentiles appear here as the search finishes it"


def capacity_figure(data: dict) -> go.Figure:
    """The whole figure (an empty titled one, saying what will come, before the first probe)."""
    if not data.get("probes"):
        return empty_figure(TITLE, NO_PROBE)
    panels = figure_panels(data)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p["title"] for p in panels],
                        horizontal_spacing=0.08)
    units = [draw_panel(fig, col, panel, data) for col, panel in enumerate(panels, start=1)]
    fig = _layout(fig, TITLE, data["unit"], "", NO_PROBE)
    for col, unit in enumerate(units, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    levels = sorted({p["level"] for p in data["probes"]})
    fig.update_xaxes(type="log", title_text=data["unit"], tickvals=levels, ticktext=[f"{v:g}" for v in levels])
    fig.update_layout(height=400, title_font_size=14, margin=dict(t=80))
    return fig


def figure_panels(data: dict) -> list[dict]:
    """One panel per target (its percentile, its limit), then p95 TTFT and TPOT where no target bounds them."""
    panels = [{"title": f"{target_label(t)} (target {seconds_words(t['limit_s'])})", "limit_s": t["limit_s"],
               "read": ("values", t["name"])} for t in data["targets"]]
    bounded = {t["metric"] for t in data["targets"]}
    return panels + [{"title": f"{m.upper()} p95 (no target)", "limit_s": None, "read": (f"{m}_s", "p95")}
                     for m in ("ttft", "tpot") if m not in bounded]


def panel_value(probe: dict, panel: dict) -> float | None:
    """A probe's value in a panel, in seconds (None: no value)."""
    where, key = panel["read"]
    return (probe.get(where) or {}).get(key)


def panel_scale(data: dict, panel: dict) -> tuple[float, str]:
    """Milliseconds where the panel's largest value (or its limit) is under a second, else seconds."""
    values = [v for p in data["probes"] if (v := panel_value(p, panel)) is not None]
    top = max([*values, panel["limit_s"] or 0], default=0)
    return (1000.0, "ms") if top < 1 else (1.0, "s")


def draw_panel(fig: go.Figure, col: int, panel: dict, data: dict) -> str:
    """One panel: every engine's probes, the limit, the capacities; returns its unit (ms or s)."""
    scale, unit = panel_scale(data, panel)
    for engine in data["engines"]:
        runs = sorted((p for p in data["probes"] if p["engine"] == engine), key=lambda p: (p["level"], p["repeat"]))
        fig.add_trace(probe_trace(engine, runs, panel, scale, unit, data["unit"], col == 1), row=1, col=col)
    tops = [v * scale for p in data["probes"] if (v := panel_value(p, panel)) is not None]
    if panel["limit_s"] is not None:
        fig.add_hline(y=panel["limit_s"] * scale, line_dash="dash", row=1, col=col, annotation_text="target",
                      annotation_position="top left")
        tops.append(panel["limit_s"] * scale)
    for engine in data["engines"]:
        line = capacity_trace(engine, data["capacity"].get(engine) or {}, max(tops, default=0) * 1.05, col == 1)
        if line is not None:
            fig.add_trace(line, row=1, col=col)
    return unit


def probe_trace(engine: str, runs: list[dict], panel: dict, scale: float, unit: str, level_unit: str,
                legend: bool) -> go.Scatter:
    """One engine's probes in one panel: a circle where the level met the target, a cross where it missed."""
    values = [panel_value(p, panel) for p in runs]
    met = [p["level_met"] if p["level_met"] is not None else p["met"] for p in runs]
    return go.Scatter(
        x=[p["level"] for p in runs], y=[None if v is None else v * scale for v in values], mode="lines+markers",
        name=registry.label(engine), legendgroup=engine, showlegend=legend,
        line=dict(color=ENGINE_COLORS.get(engine)),
        marker=dict(size=9, symbol=["circle" if ok else "x" for ok in met]),
        text=[f"{level_words(p['level'], level_unit)}, run {p['repeat'] + 1}: {'met' if ok else 'missed'}"
              for p, ok in zip(runs, met, strict=True)],
        hovertemplate=f"%{{text}}<br>%{{y:.3g}} {unit}<extra>{registry.label(engine)}</extra>")


def capacity_trace(engine: str, found: dict, top: float, legend: bool) -> go.Scatter | None:
    """An engine's capacity as a dotted vertical line up to ``top`` (None where it met the target at no level)."""
    if not found.get("value") or found.get("bound") not in ("exact", "at_least"):
        return None
    at_least = "at least " if found["bound"] == "at_least" else ""
    return go.Scatter(x=[found["value"], found["value"]], y=[0, top], mode="lines", legendgroup=engine,
                      name=f"{registry.label(engine)} capacity: {at_least}{level_words(found['value'], found['unit'])}",
                      showlegend=legend, line=dict(color=ENGINE_COLORS.get(engine), dash="dot", width=2),
                      hoverinfo="name")


def probes_table(data: dict) -> pd.DataFrame:
    """Every probe as the CLI's table (lab.capacity.probe_rows: latencies in ms, Little's law computed)."""
    return pd.DataFrame(probe_rows(data))
