"""Figures of the KV-cache experiments (lab/experiments), shared by the KV cache tab and the notebooks.

One figure function per experiment (``experiment_figure`` picks it), plus the live pictures of the
blocks experiment: vLLM's pool as a grid of blocks per request (derived, and titled so) and HF's
contiguous slab for its current batch. Every number drawn comes from the experiment's result.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.engines import registry
from lab.experiments.blocks import derive_grid
from lab.experiments.table import default_step, refs_at, step_view
from lab.experiments.table_words import table_step_answer
from lab.metrics.kv import used_blocks
from lab.plots import ENGINE_COLORS, _layout
from lab.plots.why import ladder_figure
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
                name=f"{registry.label(engine)} {workload}-bound (x{gain:.1f})" if gain else engine,
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


# -- vLLM's real block table, as the vLLM paper draws it (its Fig. 6): logical blocks -> physical blocks ----------
REQUEST_COLORS = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#882255",
                  "#44AA99", "#999933"]  # Okabe-Ito, then Tol: told apart by most eyes; labels name them anyway
CELL_KINDS = {"free, not handed out yet": FREE, "freed earlier, back on the free list": "#bcd4e6",
              "shared (held by several: x refcount)": "#2e282a", "vLLM's null block (never handed out)": "#9e9e9e"}
POOL_COLUMNS = 8


def block_table_view(result, step: int | None = None) -> tuple[go.Figure, str]:
    """vLLM's block table after one engine step of a ``table`` result, and the one sentence saying what it shows.

    Args:
        result: The table experiment's result (live, stored, or a SimpleNamespace of fields and series).
        step: The engine step; default the one where most requests held one block at once.

    Returns:
        (the figure, its sentence).

    Raises:
        ValueError: a step the run does not have, naming the range.
    """
    steps = result.series.get("steps", [])
    if not steps:
        return _layout(go.Figure(), "vLLM's block table", "", "", TABLE_EMPTY), TABLE_EMPTY
    view = step_view(steps, default_step(steps) if step is None else step)
    size = result.fields["block_size"]
    return block_table_figure(view, steps, result.fields["num_blocks"], size), table_step_answer(view, size)


TABLE_EMPTY = "vLLM's block ids per request appear here once the table experiment's engine has run its steps."


def table_figure(result) -> go.Figure:
    """The table experiment's figure: its block table at the step where most requests held one block at once."""
    return block_table_view(result)[0]


def block_table_figure(view: dict, steps: list, num_blocks: int, block_size: int) -> go.Figure:
    """Per request, its logical blocks -> the physical blocks vLLM gave it (left), the pool of physical blocks:
    held, shared with their reference count, freed and back on the free list, never used (right), and the blocks
    held at every step with this one marked (below). Every id is vLLM's own."""
    colors = _request_colors(steps)
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], column_widths=[0.45, 0.55],
                        row_heights=[0.74, 0.26], vertical_spacing=0.16, horizontal_spacing=0.06,
                        subplot_titles=["block tables: each request's logical blocks -> physical block ids",
                                        f"physical KV blocks: vLLM's pool of {num_blocks}",
                                        "blocks held after each engine step"])
    _logical_cells(fig, view, colors, block_size)
    _pool_cells(fig, view, colors, num_blocks)
    _held_timeline(fig, steps, view["step"])
    _legend_keys(fig, view, colors)
    title = (f"vLLM's block table after engine step {view['step']} of {len(steps) - 1} (real ids, read from its KV "
             f"cache manager; blocks of {block_size} tokens)")
    fig = _layout(fig, title, "", "")
    fig.update_layout(height=620, margin=dict(l=90, r=20, t=80, b=40), legend=dict(y=-0.12))
    fig.update_xaxes(title_text="logical block", row=1, col=1)  # after _layout, which names the first axes
    return fig.update_xaxes(showgrid=False, zeroline=False)


def _request_colors(steps: list) -> dict:
    """Each request of the run -> its colour, kept at every step (in the order requests first held a block)."""
    requests = dict.fromkeys(r for s in steps for r in s["tables"])
    return {r: REQUEST_COLORS[i % len(REQUEST_COLORS)] for i, r in enumerate(requests)}


def _cell_scale(colors: list) -> list:
    """A stepped colour scale for cells whose value k is the k-th colour."""
    n = len(colors)
    return [stop for i, c in enumerate(colors) for stop in ([i / n, c], [(i + 1) / n, c])]


def _heatmap(z: list, text: list, hover: list, colors: list) -> go.Heatmap:
    """Cells coloured by their index into ``colors``, each labelled and hovered with its own words."""
    return go.Heatmap(z=z, text=text, hovertext=hover, hoverinfo="text", texttemplate="%{text}", showscale=False,
                      xgap=2, ygap=2, colorscale=_cell_scale(colors), zmin=-0.5, zmax=len(colors) - 0.5)


def _logical_cells(fig, view: dict, colors: dict, block_size: int) -> None:
    """One row per request holding blocks: logical block i -> its physical id, the slots its tokens fill."""
    kinds, requests = list(CELL_KINDS.values()), list(view["tables"])
    palette = kinds + [colors[r] for r in requests]
    width = max((len(ids) for ids in view["tables"].values()), default=0)
    z, text, hover = [], [], []
    for row, request in enumerate(requests):
        ids, tokens = view["tables"][request], (view["tokens"] or {}).get(request)
        cells = [_logical_cell(view, request, i, b, tokens, block_size) for i, b in enumerate(ids)]
        z.append([2 if view["refs"][b] > 1 else len(kinds) + row for b in ids] + [None] * (width - len(ids)))
        text.append([c[0] for c in cells] + [""] * (width - len(ids)))
        hover.append([c[1] for c in cells] + [""] * (width - len(ids)))
    fig.add_trace(_heatmap(z, text, hover, palette), row=1, col=1)
    fig.update_xaxes(tickvals=list(range(width)), row=1, col=1)
    fig.update_yaxes(tickvals=list(range(len(requests))), ticktext=requests, autorange="reversed", row=1, col=1)


def _logical_cell(view: dict, request: str, index: int, block: int, tokens: int | None, size: int) -> tuple:
    """A logical block's label (its physical id, x holders where shared, slots filled) and its hover words."""
    refs = view["refs"][block]
    filled = None if tokens is None else max(0, min(size, tokens - index * size))
    label = f"{block}" + (f" x{refs}" if refs > 1 else "") + ("" if filled is None else f"<br>{filled}/{size}")
    words = (f"{request}: logical block {index} -> physical block {block}; held by {refs}"
             + ("" if filled is None else f"; {filled} of {size} slots hold tokens"))
    return label, words


def _pool_cells(fig, view: dict, colors: dict, num_blocks: int) -> None:
    """vLLM's pool, POOL_COLUMNS blocks a row: each block coloured by who holds it now, or why it is free."""
    kinds, requests = list(CELL_KINDS.values()), list(dict.fromkeys(colors))
    palette = kinds + [colors[r] for r in requests]
    owners = {b: r for r, ids in view["tables"].items() for b in ids}
    cells = [_pool_cell(view, b, owners.get(b), requests, len(kinds)) for b in range(num_blocks)]
    cells += [(None, "", "")] * (-num_blocks % POOL_COLUMNS)
    rows = [cells[i:i + POOL_COLUMNS] for i in range(0, len(cells), POOL_COLUMNS)]
    fig.add_trace(_heatmap(*([[c[k] for c in row] for row in rows] for k in range(3)), palette), row=1, col=2)
    fig.update_xaxes(showticklabels=False, row=1, col=2)
    fig.update_yaxes(showticklabels=False, autorange="reversed", row=1, col=2)


def _pool_cell(view: dict, block: int, owner: str | None, requests: list, first: int) -> tuple:
    """(colour index, label, hover words) of one physical block after the view's step."""
    refs = view["refs"].get(block, 0)
    if refs > 1:
        return 2, f"{block}<br>x{refs}", f"block {block}: shared, held by {refs} requests (reference count {refs})"
    if owner is not None:
        return first + requests.index(owner), f"{block}<br>{owner}", f"block {block}: held by {owner}"
    if block in view["freed"]:
        return 1, f"{block}<br>freed", f"block {block}: freed earlier, back on the free list"
    if block == 0:
        return 3, "0<br>null", "block 0: vLLM's null block, never handed out"
    return 0, f"{block}", f"block {block}: free, not handed out yet"


def _held_timeline(fig, steps: list, step: int) -> None:
    """Blocks held and requests holding them after every step (vLLM's ids counted), the view's step marked."""
    xs = [s["step"] for s in steps]
    fig.add_trace(go.Scatter(x=xs, y=[len(refs_at(s)) for s in steps], mode="lines", line_shape="hv",
                             name="blocks held", line=dict(color="#2e282a")), row=2, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[len(s["tables"]) for s in steps], mode="lines", line_shape="hv",
                             name="requests holding blocks", line=dict(color="#0072B2", dash="dot")), row=2, col=1)
    fig.add_vline(x=step, line=dict(color="#D55E00", width=2), row=2, col=1)
    fig.update_xaxes(title_text="engine step", row=2, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)


def _legend_keys(fig, view: dict, colors: dict) -> None:
    """Legend entries for the cells' colours: the requests holding blocks now, then the kinds of cell."""
    keys = {r: colors[r] for r in view["tables"]} | CELL_KINDS
    for name, color in keys.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                 marker=dict(symbol="square", size=12, color=color)), row=1, col=2)


FIGURES = {"cache": cache_figure, "table": table_figure,
           "waste": waste_figure, "blocks": blocks_check_figure, "prefix": prefix_figure,
           "phases": phases_figure, "preemption": preemption_figure, "sharing": sharing_figure,
           "memory": memory_figure, "why": ladder_figure}
