"""Figures and tables shared by the dashboard and the notebooks: pure functions of run data.

Live figures (over time) take a RunResult; summary figures (bars, ratio, latency table) take the
summary.json dict, so a stored run draws exactly like a live one. Numbers come from lab.metrics only.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from lab.metrics import throughput_series
from lab.metrics.kv import used_blocks
from lab.runs import RunResult

ENGINE_LABELS = {"hf": "HF generate (static batch)", "vllm": "vLLM (paged, continuous)"}
ENGINE_COLORS = {"hf": "#e4572e", "vllm": "#17bebb"}
MIB = 1024**2


def _label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=320, margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25), template="plotly_white")
    return fig


def _gapped(series_per_level: Sequence[list[tuple[float, float]]]) -> tuple[list, list]:
    """Join per-level series with None between them, so a line breaks where its engine was idle."""
    xs, ys = [], []
    for series in series_per_level:
        if xs:
            xs.append(None)
            ys.append(None)
        xs.extend(x for x, _ in series)
        ys.extend(y for _, y in series)
    return xs, ys


def throughput_figure(result: RunResult, bucket_s: float = 1.0) -> go.Figure:
    """Output tok/s over time, one line per engine (tokens arrived per second of the run)."""
    fig = go.Figure()
    for engine in result.plan.engines:
        levels = [lvl for lvl in result.levels if lvl.engine == engine and lvl.records]
        if not levels:
            continue
        per_level = []
        for lvl in levels:
            series = throughput_series(lvl.records, bucket_s, origin_s=result.origin_s)
            start = min(r.send_s for r in lvl.records) - result.origin_s
            per_level.append([(x, y) for x, y in series if x >= start - bucket_s])
        xs, ys = _gapped(per_level)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=_label(engine),
                                 line=dict(color=ENGINE_COLORS.get(engine))))
    return _layout(fig, "Output tok/s over time", "seconds since run start", "tok/s")


def _headroom(fig: go.Figure, values: Sequence[float]) -> go.Figure:
    """Leave room above the tallest bar for its printed value."""
    top = max((v for v in values if v is not None), default=0)
    if top > 0:
        fig.update_yaxes(range=[0, top * 1.25])
    return fig


def tok_s_bars(summary: dict) -> go.Figure:
    """Final output tok/s per user level, grouped by engine."""
    fig = go.Figure()
    for engine in summary["engines"]:
        rows = [r for r in summary["runs"] if r["engine"] == engine]
        fig.add_trace(go.Bar(x=[str(r["users"]) for r in rows], y=[r["output_tok_s"] for r in rows],
                             name=_label(engine), marker_color=ENGINE_COLORS.get(engine),
                             text=[f"{r['output_tok_s']:.0f}" for r in rows], textposition="outside"))
    fig.update_layout(barmode="group")
    _headroom(fig, [r["output_tok_s"] for r in summary["runs"]])
    return _layout(fig, "Output tok/s per user level", "concurrent users", "tok/s")


def ratio_bars(summary: dict) -> go.Figure:
    """The improvement ratio vLLM/HF per user level, with the value printed."""
    ratio = summary.get("ratio", {})
    users = sorted(ratio, key=int)
    fig = go.Figure(go.Bar(x=users, y=[ratio[u] for u in users], name="vLLM / HF",
                           text=[f"{ratio[u]:.2f}x" for u in users], textposition="outside",
                           marker_color="#4b3f72"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    _headroom(fig, list(ratio.values()) + [1.0])
    return _layout(fig, "Improvement ratio vLLM / HF (output tok/s)", "concurrent users", "ratio")


def vllm_kv_figure(result: RunResult) -> go.Figure:
    """vLLM KV blocks used (1 - free/total, vLLM's own stat) vs total, over time."""
    info = result.engine_info.get("vllm")
    samples = [s for lvl in result.levels if lvl.engine == "vllm" for s in lvl.samples]
    fig = go.Figure()
    title = "vLLM KV-cache blocks"
    if info is not None and info.kv_total_blocks:
        title += f": {info.kv_total_blocks} blocks x {info.kv_block_size} tokens"
    if samples:
        xs = [s.time_s - result.origin_s for s in samples]
        fig.add_trace(go.Scatter(x=xs, y=[used_blocks(s) for s in samples], mode="lines", line_shape="hv",
                                 name="blocks used",
                                 line=dict(color=ENGINE_COLORS["vllm"])))
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[info.kv_total_blocks] * 2 if info else [None, None],
                                 mode="lines", name="blocks total", line=dict(dash="dash", color="gray")))
    return _layout(fig, title, "seconds since run start", "blocks")


def hf_kv_figure(result: RunResult) -> go.Figure:
    """HF KV memory its static batches reserved vs the part holding real tokens, over time (MiB)."""
    samples = [s for lvl in result.levels if lvl.engine == "hf" for s in lvl.samples
               if s.kv_reserved_bytes is not None]  # an engine without byte figures draws nothing
    fig = go.Figure()
    if samples:
        xs = [s.time_s - result.origin_s for s in samples]
        fig.add_trace(go.Scatter(x=xs, y=[s.kv_reserved_bytes / MIB for s in samples], mode="lines", line_shape="hv",
                                 name="reserved by static batch", line=dict(color=ENGINE_COLORS["hf"])))
        fig.add_trace(go.Scatter(x=xs, y=[s.kv_real_bytes / MIB for s in samples], mode="lines", line_shape="hv",
                                 name="holding real tokens", line=dict(color="#f2a541")))
    return _layout(fig, "HF KV cache: reserved vs real tokens", "seconds since run start", "MiB")


def queue_figure(result: RunResult) -> go.Figure:
    """Requests running and waiting inside each engine, over time."""
    fig = go.Figure()
    for engine in result.plan.engines:
        samples = [s for lvl in result.levels if lvl.engine == engine for s in lvl.samples]
        if not samples:
            continue
        xs = [s.time_s - result.origin_s for s in samples]
        color = ENGINE_COLORS.get(engine)
        fig.add_trace(go.Scatter(x=xs, y=[s.running for s in samples], mode="lines", line_shape="hv",
                                 name=f"{_label(engine)}: running", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=xs, y=[s.waiting for s in samples], mode="lines", line_shape="hv",
                                 name=f"{_label(engine)}: waiting", line=dict(color=color, dash="dot")))
    return _layout(fig, "Requests running / waiting", "seconds since run start", "requests")


def latency_table(summary: dict) -> pd.DataFrame:
    """TTFT, TPOT and E2E p50/p90/p99 per engine and level (milliseconds), with tok/s and errors."""
    rows = []
    for r in summary["runs"]:
        row = {"engine": r["engine"], "users": r["users"], "status": r.get("status", ""),
               "done": r.get("completed", r["requests"]), "errors": r["errors"],
               "out tok/s": round(r["output_tok_s"], 1)}
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            for q in ("p50", "p90", "p99"):
                value = r[metric][q]
                row[f"{metric[:-2].upper()} {q} (ms)"] = None if value is None else round(value * 1000, 1)
        rows.append(row)
    return pd.DataFrame(rows)


def compare_figure(summaries: Sequence[dict]) -> go.Figure:
    """Output tok/s per user level for several stored runs side by side."""
    fig = go.Figure()
    for s in summaries:
        for engine in s["engines"]:
            rows = [r for r in s["runs"] if r["engine"] == engine]
            fig.add_trace(go.Bar(x=[str(r["users"]) for r in rows], y=[r["output_tok_s"] for r in rows],
                                 name=f"{s['run_id'][:6]} {engine} ({s['workload']})"))
    fig.update_layout(barmode="group")
    return _layout(fig, "Output tok/s: runs compared", "concurrent users", "tok/s")


def compare_ratio_figure(summaries: Sequence[dict]) -> go.Figure:
    """The vLLM/HF ratio per user level for several stored runs."""
    fig = go.Figure()
    for s in summaries:
        users = sorted(s.get("ratio", {}), key=int)
        fig.add_trace(go.Scatter(x=users, y=[s["ratio"][u] for u in users], mode="lines+markers+text",
                                 text=[f"{s['ratio'][u]:.2f}x" for u in users], textposition="top center",
                                 name=f"{s['run_id'][:6]} ({s['workload']}, {s['device'].get('name', '')})"))
    return _layout(fig, "Ratio vLLM / HF: runs compared", "concurrent users", "ratio")
