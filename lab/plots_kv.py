"""Figures of the KV-cache experiments (lab/experiments), shared by the KV cache tab and the notebooks.

One figure function per experiment (``experiment_figure`` picks it), plus the live pictures of the
blocks experiment: vLLM's pool as a grid of blocks per request (derived, and titled so) and HF's
contiguous slab for its current batch. Every number drawn comes from the experiment's result.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.experiments.blocks import derive_grid
from lab.metrics.kv import used_blocks
from lab.plots import ENGINE_COLORS, _layout
from lab.plots_why import ladder_figure
from lab.status import RunStatus

FREE = "#f4f4f4"
PALETTE = ["#17bebb", "#e4572e", "#76b041", "#ffc914", "#2e282a", "#8f3985", "#3d5a80", "#ee6c4d",
           "#98c1d9", "#a44a3f", "#5b8e7d", "#f4a259"]


def experiment_figure(result) -> go.Figure:
    """The figure of any experiment result (an empty titled figure until it has data)."""
    draw = FIGURES.get(result.experiment)
    return draw(result) if draw else _layout(go.Figure(), result.experiment, "", "")


WASTE_LABELS = {"hf": "HF", "hf-static": "HF static cache", "vllm": "vLLM"}
KIND_LABELS = {"real": "tokens", "reservation": "reservation", "internal": "internal fragmentation",
               "external": "external fragmentation"}
KIND_COLORS = {"real": "#76b041", "reservation": "#ffc914", "internal": "#e4572e", "external": "#2e282a"}


def waste_figure(result) -> go.Figure:
    """Held vs real KV tokens over time per engine (left), and what the memory x time each held held, by kind, in
    the vLLM paper's terms (right; all measured from the engines' own counts)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.12,
                        subplot_titles=["held vs real tokens over time", "what the held KV held (time-weighted)"])
    for engine, rows in result.series.items():
        if rows:
            _held_lines(fig, engine, rows, result.fields.get(engine, {}))
    for kind, label in KIND_LABELS.items():
        engines = [e for e in result.series if result.fields.get(e, {}).get("kinds_pct", {}).get(kind) is not None]
        fig.add_trace(go.Bar(x=[WASTE_LABELS.get(e, e) for e in engines], name=label, marker_color=KIND_COLORS[kind],
                             y=[result.fields[e]["kinds_pct"][kind] for e in engines]), row=1, col=2)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="% of memory x time", range=[0, 100], row=1, col=2)
    return _layout(fig, "KV memory held vs holding real tokens", "seconds since the engine's run start", "")


def _held_lines(fig, engine: str, rows: list, fields: dict) -> None:
    label, color = WASTE_LABELS.get(engine, engine), ENGINE_COLORS.get(engine, ENGINE_COLORS["hf-static"])
    xs = [r[0] for r in rows]
    waste = fields.get("waste_pct", {}).get("mean")
    fig.add_trace(go.Scatter(x=xs, y=[r[1] for r in rows], mode="lines", line_shape="hv", line=dict(color=color),
                             name=f"{label}: held ({waste}% wasted, time-weighted)"), row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[r[2] for r in rows], mode="lines", line_shape="hv",
                             name=f"{label}: real tokens", line=dict(color=color, dash="dot")), row=1, col=1)


def blocks_check_figure(result) -> go.Figure:
    """vLLM's own used blocks against the count derived from the requests' tokens, at every step."""
    rows = result.series.get("check", [])
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[r[0] for r in rows], y=[r[1] for r in rows], mode="lines", line_shape="hv",
                             name="vLLM's used blocks (1 - free/total)", line=dict(color=ENGINE_COLORS["vllm"])))
    fig.add_trace(go.Scatter(x=[r[0] for r in rows], y=[r[2] for r in rows], mode="lines", line_shape="hv",
                             name="derived from token counts", line=dict(color="#2e282a", dash="dot")))
    agree = result.fields.get("agree")
    verdict = "" if agree is None else f" (agree within 1 per running request: {'yes' if agree else 'no'})"
    return _layout(fig, f"Blocks: vLLM's count vs derived{verdict}", "seconds since run start", "blocks",
                   "vLLM's used blocks and the count derived from token counts appear here once vLLM's level has run.")


def prefix_figure(result) -> go.Figure:
    """Prefix-cache hit rate and TTFT p50 with the constant block first vs last."""
    orders = [o for o in ("first", "last") if o in result.fields]
    hit = [100 * (result.fields[o]["hit_rate"] or 0) for o in orders]
    ttft = [1000 * (result.fields[o]["ttft_p50_s"] or 0) for o in orders]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[f"constant block {o}" for o in orders], y=hit, name="prefix-cache hit rate (%)",
                         text=[f"{v:.0f}%" for v in hit], marker_color=ENGINE_COLORS["vllm"]))
    fig.add_trace(go.Bar(x=[f"constant block {o}" for o in orders], y=ttft, name="TTFT p50 (ms)",
                         text=[f"{v:.0f} ms" for v in ttft], marker_color="#2e282a"))
    fig.update_layout(barmode="group")
    return _layout(fig, "Prefix caching: where the constant block goes", "", "% / ms")


def phases_figure(result) -> go.Figure:
    """Output tok/s against users, per engine and workload (prefill-bound solid, decode-bound dashed)."""
    fig = go.Figure()
    for workload, engines in result.fields.items():
        for engine, data in engines.items():
            levels = sorted(data["tok_s"], key=int)
            gain = data["gain"]
            fig.add_trace(go.Scatter(
                x=[int(u) for u in levels], y=[data["tok_s"][u] for u in levels], mode="lines+markers",
                name=f"{'HF' if engine == 'hf' else 'vLLM'} {workload}-bound (x{gain:.1f})" if gain else engine,
                line=dict(color=ENGINE_COLORS.get(engine), dash="solid" if workload == "prefill" else "dash")))
    return _layout(fig, "What concurrency buys: prefill- vs decode-bound", "concurrent users", "output tok/s")


def preemption_figure(result) -> go.Figure:
    """vLLM's preemptions (cumulative) and waiting requests over time, small pool vs normal pool."""
    fig = go.Figure()
    for (pool, rows), color in zip(result.series.items(), PALETTE, strict=False):
        xs = [r[0] for r in rows]
        fig.add_trace(go.Scatter(x=xs, y=[r[2] for r in rows], mode="lines", line_shape="hv",
                                 name=f"{pool}: preemptions", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=xs, y=[r[1] for r in rows], mode="lines", line_shape="hv",
                                 name=f"{pool}: waiting", line=dict(color=color, dash="dot")))
    return _layout(fig, "Preemption: a small KV pool under load", "seconds since the pool's first request", "count")


def sharing_figure(result) -> go.Figure:
    """Peak KV blocks per variant against n unshared copies, with tok/s printed."""
    variants = {k: v for k, v in result.fields.items() if isinstance(v, dict)}
    labels = [f"{v['peak_blocks']} blocks, {v['output_tok_s']:.0f} tok/s" for v in variants.values()]
    fig = go.Figure(go.Bar(x=list(variants), y=[v["peak_blocks"] for v in variants.values()], text=labels,
                           marker_color=ENGINE_COLORS["vllm"], name="peak used blocks (vLLM's count)"))
    unshared = result.fields.get("unshared_blocks_estimate")
    if unshared:
        fig.add_hline(y=unshared, line_dash="dot", annotation_text=f"n unshared copies: {unshared} blocks")
    return _layout(fig, "Block sharing: n answers from one prompt", "", "blocks")


def memory_figure(result) -> go.Figure:
    """The device's memory as the plan splits it: weights, vLLM's KV, what is left (GiB)."""
    f = result.fields
    gib = 1024**3
    if f.get("refused") or "kv_bytes_planned" not in f:
        return _layout(go.Figure(), f"Refused: {f.get('reason', 'not planned yet')}", "", "GiB")
    parts = {"model weights": f["weights_bytes"], "vLLM KV cache (planned)": f["kv_bytes_planned"],
             "rest of the device": max(0, f["total_bytes"] - f["weights_bytes"] - f["kv_bytes_planned"])}
    fig = go.Figure()
    for (name, value), color in zip(parts.items(), PALETTE, strict=False):
        fig.add_trace(go.Bar(x=[value / gib], y=[f["device"]], orientation="h", name=name, marker_color=color,
                             text=f"{value / gib:.2f} GiB"))
    fig.update_layout(barmode="stack")
    title = (f"{f['kv_blocks_planned']:,} blocks of {f['block_size']} tokens = "
             f"{f['max_len_requests_at_once']} requests of {f['max_model_len']} tokens at once")
    return _layout(fig, title, "GiB", "")


def live_blocks_figure(result) -> go.Figure:
    """The live picture of the engine running now: vLLM's pool as blocks per request, or HF's slab."""
    run = result.run if result is not None else None
    level = run.levels[-1] if run is not None and run.levels else None
    if level is None:
        return _layout(go.Figure(), "KV pool, live", "", "", _no_pool_words(result))
    if level.engine == "hf":
        return hf_slab_figure(level)
    info = run.engine_info.get("vllm")
    return block_grid_figure(level, info.kv_block_size, info.kv_total_blocks)


def _no_pool_words(result) -> str:
    """Why there is no live pool to draw: no experiment yet, or one whose load run has not begun or that runs none."""
    if result is None:
        return "No experiment yet: the KV pool of the next experiment's load run is drawn here live."
    going = result.status == RunStatus.RUNNING
    if result.run is not None:
        return f"Experiment {result.experiment} is starting its load run: its KV pool appears here."
    return (f"Experiment {result.experiment} {'is running' if going else 'ran'} without a load run of both engines: "
            "its own figure below shows what it measures.")


def block_grid_figure(level, block_size: int, num_blocks: int, width: int = 32) -> go.Figure:
    """vLLM's pool as a grid, one cell per block, coloured by the request that holds it (derived).

    While the level runs the picture is of now; once it ended, of the step where vLLM used most blocks.
    """
    when, sample, moment = _picture_moment(level)
    cells = derive_grid(level.sent, when, block_size, num_blocks)
    owners = {rid: i for i, rid in enumerate(dict.fromkeys(c for c in cells if c))}
    z = [owners[c] + 1 if c else 0 for c in cells] + [None] * (-len(cells) % width)
    rows = [z[i:i + width] for i in range(0, len(z), width)]
    hover = [[(cells[i + j] or "free") if i + j < len(cells) else "" for j in range(width)]
             for i in range(0, len(z), width)]
    fig = go.Figure(go.Heatmap(z=rows, text=hover, hoverinfo="text", showscale=False, xgap=1, ygap=1,
                               colorscale=_steps(len(owners)), zmin=-0.5, zmax=len(owners) + 0.5))
    fig.update_yaxes(autorange="reversed", showticklabels=False, rangemode="normal")  # cells centred on 0
    fig.update_xaxes(showticklabels=False, rangemode="normal")
    used = sum(1 for c in cells if c)
    own = used_blocks(sample) if sample is not None else "no step yet"
    plural = "request" if len(owners) == 1 else "requests"
    return _layout(fig, f"vLLM KV pool {moment}, DERIVED from token counts: {used}/{num_blocks} blocks of "
                        f"{block_size} for {len(owners)} {plural} (vLLM's own count: {own})", "", "")


def _steps(owners: int) -> list:
    """A stepped colour scale: value 0 is a free block, value k the k-th request's colour."""
    colors = [FREE] + [PALETTE[k % len(PALETTE)] for k in range(owners)]
    n = len(colors)
    return [stop for i, c in enumerate(colors) for stop in ([i / n, c], [(i + 1) / n, c])]


def _picture_moment(level) -> tuple:
    """(time to derive at, the vLLM sample it matches, words): now while running, else vLLM's peak step."""
    samples = [s for s in level.samples if s.kv_usage is not None]
    if level.status == RunStatus.RUNNING or not samples:
        return time.perf_counter(), samples[-1] if samples else None, "now"
    peak = max(range(len(samples)), key=lambda i: samples[i].kv_usage)
    after = samples[peak + 1].time_s if peak + 1 < len(samples) else float("inf")
    return after, samples[peak], "at its fullest step"


def hf_slab_figure(level) -> go.Figure:
    """HF's contiguous KV slab for its current batch: real tokens vs padding and finished rows."""
    samples = [s for s in level.samples if s.kv_reserved_bytes is not None]
    if not samples:
        return _layout(go.Figure(), "HF static batch: one contiguous KV slab", "", "",
                       "HF's KV slab appears here once its first batch runs.")
    last = samples[-1]
    reserved, real = last.kv_reserved_bytes, last.kv_real_bytes
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[real / 2**20], y=["current batch"], orientation="h", name="real tokens",
                         marker_color=ENGINE_COLORS["hf"]))
    fig.add_trace(go.Bar(x=[(reserved - real) / 2**20], y=["current batch"], orientation="h",
                         name="padding and finished rows", marker_color="#f2c4b5"))
    fig.update_layout(barmode="stack")
    batch = last.running
    return _layout(fig, f"HF static batch of {batch}: one contiguous KV slab (MiB)", "MiB", "")


def cache_figure(result) -> go.Figure:
    """Milliseconds per output token against the decode's length, with and without the KV cache (measured)."""
    fig = go.Figure()
    for (mode, points), color in zip(result.series.items(), PALETTE, strict=False):
        if points:
            fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                     name=mode, line=dict(color=color)))
    fig = _layout(fig, "Time per output token as the sequence grows (HF, one request)", "output tokens decoded",
                  "ms per output token")
    return fig.update_yaxes(rangemode="tozero") if fig.data else fig


def table_figure(result) -> go.Figure:
    """vLLM's real block ids per request at every engine step: one colour per request, a block's row its id."""
    fig = go.Figure()
    steps = result.series.get("steps", [])
    requests = list(dict.fromkeys(r for s in steps for r in s["tables"]))
    for request, color in zip(requests, PALETTE * 4, strict=False):
        points = [(s["step"], b) for s in steps for b in s["tables"].get(request, [])]
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="markers", name=request,
                                 marker=dict(color=color, symbol="square", size=6)))
    title = "vLLM's block table, read from its KV cache manager (real block ids)"
    return _layout(fig, title, "engine step", "physical block id")


FIGURES = {"cache": cache_figure, "table": table_figure,
           "waste": waste_figure, "blocks": blocks_check_figure, "prefix": prefix_figure,
           "phases": phases_figure, "preemption": preemption_figure, "sharing": sharing_figure,
           "memory": memory_figure, "why": ladder_figure}
