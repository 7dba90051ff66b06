"""The figure of a sweep (lab.sweeps): what each value of one knob measured, drawn against the knob.

Takes the sweep.json dict (``SweepResult.to_dict()``), so a stored sweep draws exactly like a live one.
Four panels: output tok/s; TTFT and TPOT p50; the KV cache (vLLM: blocks in the pool and peak used;
HF: peak reserved bytes); and the engine restart each value cost. One line per user level. Values
are drawn as categories, evenly spaced (1, 4, 16, 64 read better so than on a linear axis); every y-axis
starts at 0, so that a small difference looks small.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.engines import registry
from lab.plots import ENGINE_COLORS, LOOK, MIB

PANELS = ("output tok/s", "TTFT / TPOT p50 (ms)", "KV cache", "engine restart (s)")
DASHES = ("solid", "dash", "dot", "dashdot")
EMPTY_SWEEP = "Each value's tok/s, latencies, KV cache and restart time appear here as it finishes."
COLORS = registry.View(lambda: {**ENGINE_COLORS, "ttft": "#3d5a80", "tpot": "#ee6c4d", "used": "#17bebb",
                                 "total": "#2e282a", "restart": "#8f3985"})  # engines' colours read at each use


def user_levels(points: list[dict]) -> list[int]:
    """The user levels the points measured (from their ``output_tok_s@U`` keys), in order."""
    return sorted({int(k.split("@")[1]) for p in points for k in p if k.startswith("output_tok_s@")})


def sweep_figure(sweep: dict) -> go.Figure:
    """Four panels against the knob's values; empty (titled) until the first value is measured."""
    points, engine = sweep.get("points", []), sweep.get("engine", "vllm")
    fig = make_subplots(rows=2, cols=2, subplot_titles=_titles(engine), vertical_spacing=0.18)
    xs = [str(p["value"]) for p in points]
    for i, users in enumerate(user_levels(points)):
        dash, tag = DASHES[i % len(DASHES)], f"{users} users"
        _line(fig, xs, _col(points, f"output_tok_s@{users}"), f"tok/s, {tag}", engine, dash, 1, 1)
        _line(fig, xs, _col(points, f"ttft_p50_s@{users}", 1000), f"TTFT p50, {tag}", "ttft", dash, 1, 2)
        _line(fig, xs, _col(points, f"tpot_p50_s@{users}", 1000), f"TPOT p50, {tag}", "tpot", dash, 1, 2)
        if registry.spec(engine).kv_pool:
            _line(fig, xs, _col(points, f"kv_peak_used_blocks@{users}"), f"peak used blocks, {tag}", "used", dash,
                  2, 1)
        else:
            _line(fig, xs, _col(points, f"kv_peak_reserved_bytes@{users}", 1 / MIB), f"peak reserved MiB, {tag}",
                  engine, dash, 2, 1)
    if registry.spec(engine).kv_pool:
        _line(fig, xs, _col(points, "kv_total_blocks"), "blocks in the pool", "total", "solid", 2, 1)
    _line(fig, xs, _col(points, "restart_s"), "restart", "restart", "solid", 2, 2)
    fig.update_xaxes(type="category", title_text=sweep.get("knob", ""))
    fig.update_yaxes(rangemode="tozero")  # a 0.7% difference must not look steep
    title = f"Sweep of {sweep['knob']} ({sweep.get('status', '')})" if sweep.get("knob") else "Sweep"
    fig.update_layout(title=title, height=620,
                      margin=dict(l=50, r=20, t=70, b=40), template=LOOK,
                      legend=dict(orientation="h", y=-0.12))
    if not points:
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.add_annotation(text=EMPTY_SWEEP, showarrow=False, font=dict(color="gray"), x=0.5, y=0.5, xref="paper",
                           yref="paper")
    return fig


def _titles(engine: str) -> tuple[str, ...]:
    kv = "KV blocks: pool and peak used" if registry.spec(engine).kv_pool else "HF peak reserved KV (MiB)"
    return PANELS[0], PANELS[1], kv, PANELS[3]


def _col(points: list[dict], key: str, scale: float = 1.0) -> list:
    """One measured field across the points (None where a value did not measure it)."""
    return [None if p.get(key) is None else p[key] * scale for p in points]


def _line(fig: go.Figure, xs: list, ys: list, name: str, color: str, dash: str, row: int, col: int) -> None:
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name,
                             line=dict(color=COLORS.get(color, "#2e282a"), dash=dash)), row=row, col=col)
