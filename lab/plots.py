"""Figures and tables shared by the dashboard and the notebooks: pure functions of run data.

Live figures (over time) take a RunResult; summary figures (bars, ratio, latency table) take the
summary.json dict, so a stored run draws exactly like a live one. Numbers come from lab.metrics only.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.metrics import throughput_series
from lab.metrics.kv import hf_usage_series, used_blocks, vllm_usage_series
from lab.runs import RunResult

ENGINE_LABELS = {"hf": "HF generate (static batch)", "vllm": "vLLM (paged, continuous)"}
ENGINE_COLORS = {"hf": "#e4572e", "vllm": "#17bebb"}
PATTERNS = ("", "/", ".", "x", "-", "+")  # one per compared run
EMPTY = "nothing measured here yet (or this engine is not in the run)"
LATENCY_COLUMNS = ["engine", "users", "status", "done", "errors", "out tok/s"] + [
    f"{metric} {q} (ms)" for metric in ("TTFT", "TPOT", "E2E") for q in ("p50", "p90", "p99")]
MIB = 1024**2


def _label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=320, margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25), template="plotly_white")
    if not fig.data:  # no made-up axes: say there is nothing yet
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.add_annotation(text=EMPTY, showarrow=False, font=dict(color="gray"))
    return fig


def throughput_figure(result: RunResult, bucket_s: float = 1.0) -> go.Figure:
    """Output tok/s over time: one panel per user level, both engines over the same axis (seconds since
    that engine's level began: levels run one engine after the other, so on one time axis they never meet)."""
    users = list(dict.fromkeys(lvl.users for lvl in result.levels if lvl.records))
    fig = make_subplots(rows=1, cols=max(1, len(users)), shared_yaxes=True,
                        subplot_titles=[f"{u} user{'s' if u > 1 else ''}" for u in users] or None)
    for col, level_users in enumerate(users, 1):
        for lvl in (lvl for lvl in result.levels if lvl.users == level_users and lvl.records):
            series = throughput_series(lvl.records, bucket_s, origin_s=min(r.send_s for r in lvl.records))
            fig.add_trace(go.Scatter(x=[x for x, _ in series], y=[y for _, y in series], mode="lines",
                                     name=_label(lvl.engine), legendgroup=lvl.engine, showlegend=col == 1,
                                     line=dict(color=ENGINE_COLORS.get(lvl.engine))), row=1, col=col)
    _layout(fig, "Output tok/s over time, level by level", "", "tok/s")
    fig.update_xaxes(title_text="s since the level began")
    return fig


def run_span_s(result: RunResult) -> float | None:
    """Seconds from the run's start to its last token or engine sample (the time plots share this range)."""
    ends = [t for lvl in result.levels for r in lvl.records for t in r.token_times_s[-1:]]
    ends += [s.time_s for lvl in result.levels for s in lvl.samples]
    return max(ends) - result.origin_s if ends else None


def _shared_span(fig: go.Figure, result: RunResult) -> go.Figure:
    span = run_span_s(result)
    if span:
        fig.update_xaxes(range=[0, span])
    return fig


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
    return _shared_span(_layout(fig, title, "seconds since run start", "blocks"), result)


def kv_tokens_figure(result: RunResult) -> go.Figure:
    """Both engines' KV cache in one unit (tokens), over run time: what each holds, and the part of it
    holding the requests' real tokens. HF holds batch x padded length (its reserved bytes / bytes per
    token); vLLM holds its used blocks x block size (its own statistic); real = prompt + output so far."""
    fig = go.Figure()
    for engine in result.plan.engines:
        series = _kv_series(result, engine)
        if not series:
            continue
        label, color = ("HF", ENGINE_COLORS["hf"]) if engine == "hf" else ("vLLM", ENGINE_COLORS["vllm"])
        xs = [row[0] - result.origin_s for row in series]
        fig.add_trace(go.Scatter(x=xs, y=[row[1] for row in series], mode="lines", line_shape="hv",
                                 name=f"{label}: held", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=xs, y=[row[2] for row in series], mode="lines", line_shape="hv",
                                 name=f"{label}: real tokens", line=dict(color=color, dash="dot")))
    return _shared_span(_layout(fig, "KV cache held vs holding real tokens, both engines", "seconds since run start",
                                "tokens"), result)


def _kv_series(result: RunResult, engine: str) -> list[tuple]:
    """(time, held tokens, real tokens, ...) of one engine over its levels (lab.metrics.kv's definitions)."""
    levels = [lvl for lvl in result.levels if lvl.engine == engine]
    if engine == "vllm":
        return [row for lvl in levels for row in vllm_usage_series(lvl.samples, lvl.records)]
    info = result.engine_info.get(engine)
    per_token = info.kv_bytes_per_token if info else None
    return [row for lvl in levels for row in hf_usage_series(lvl.samples, per_token)] if per_token else []


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
    return _shared_span(_layout(fig, "Requests running / waiting", "seconds since run start", "requests"), result)


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
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def compare_figure(summaries: Sequence[dict]) -> go.Figure:
    """Output tok/s per user level for several stored runs side by side."""
    fig = go.Figure()
    for index, s in enumerate(summaries):  # each engine keeps its colour; each run gets its own pattern
        for engine in s["engines"]:
            rows = [r for r in s["runs"] if r["engine"] == engine]
            fig.add_trace(go.Bar(x=[str(r["users"]) for r in rows], y=[r["output_tok_s"] for r in rows],
                                 name=f"{s['run_id'][:6]} {engine} ({s['workload']})",
                                 marker=dict(color=ENGINE_COLORS.get(engine),
                                             pattern_shape=PATTERNS[index % len(PATTERNS)])))
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
