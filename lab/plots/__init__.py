"""Figures and tables shared by the dashboard and the notebooks: pure functions of run data.

Live figures (over time) take a RunResult; summary figures (bars, ratio, latency table) take the
summary.json dict, so a stored run draws exactly like a live one. Numbers come from lab.metrics only.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from lab.engines.registry import BASELINE, ENGINES, RATIO_TOP, View
from lab.engines.registry import label as short_label
from lab.engines.registry import spec as engine_spec
from lab.memory import DEMO_SIZED
from lab.metrics import (
    TRUSTED_REQUESTS,
    Spread,
    ratio_from_key,
    ratio_spreads,
    thin_levels,
    tok_s_spreads,
)
from lab.metrics.kv import used_blocks
from lab.runs import RunResult

VARIANT_COLORS = {"hf-static": "#8f3985"}  # rows that are a setting of a registered engine (the waste experiment)
# read from the registry at each use, so that an engine registered later is drawn in its own colour and label
ENGINE_LABELS = View(lambda: {n: s.description for n, s in ENGINES.items() if s.in_process})  # a legend's lines
ENGINE_COLORS = View(lambda: {n: s.color for n, s in ENGINES.items() if s.in_process} | VARIANT_COLORS)
PATTERNS = ("", "/", ".", "x", "-", "+")  # one per compared run
EMPTY = "nothing measured here yet"
EMPTY_WORDS = {  # what each live figure will show, said while it has nothing to show
    "throughput": "Output tok/s per second appears here as each level's requests finish.",
    "bars": "Each engine's output tok/s appears here as its user level ends.",
    "ratio": "vLLM / HF appears here once both engines have finished a user level.",
    "vllm_kv": "vLLM's KV blocks in use appear here while vLLM runs a level.",
    "kv_tokens": "Each engine's KV cache, in tokens, appears here while it runs a level.",
    "queue": "Requests running and waiting inside each engine appear here while it runs a level.",
    "turns": "TTFT per turn appears here for a run of the chat workload (each turn re-sends the history).",
}
LATENCY_COLUMNS = ["engine", "users", "repeat", "status", "done", "errors", "out tok/s"] + [
    f"{metric} {q}" for metric in ("TTFT", "TPOT", "E2E") for q in ("p50", "p90", "p99")]  # in ms (the table's title)
MIB = 1024**2
MAX_POINTS = 600  # per live line: a GPU makes thousands of engine steps a minute, and the page redraws each second
_AXIS = dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", zerolinewidth=2, ticks="",
             automargin=True, title=dict(standoff=15), rangemode="tozero")  # a count or a speed starts at 0
# plotly_white's look in the few settings these figures use: setting template="plotly_white" deep-copies
# (and the page then receives) its whole 6.7 KB, which made up most of a live redraw's time
# (autotypenumbers "strict": user levels given as strings stay one category each, not a numeric axis)
LOOK = go.layout.Template(layout=dict(font=dict(color="#2a3f5f"), paper_bgcolor="white", plot_bgcolor="white",
                                      colorway=pio.templates["plotly"].layout.colorway, hovermode="closest",
                                      autotypenumbers="strict", hoverlabel=dict(align="left"),
                                      shapedefaults=dict(line=dict(color="#2a3f5f")),
                                      annotationdefaults=dict(arrowcolor="#2a3f5f", arrowhead=0, arrowwidth=1),
                                      title=dict(x=0.05), xaxis=_AXIS, yaxis=_AXIS))


def _label(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


def _layout(fig: go.Figure, title: str, x: str, y: str, empty: str = EMPTY) -> go.Figure:
    """Title, axes and the shared look; a figure with no point to draw shows no axes, only ``empty``: what will
    appear there."""
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=340, margin=dict(l=50, r=20, t=60, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.3), template=LOOK)
    if not has_points(fig):  # no made-up axes: say what will be here
        fig.data, fig.layout.shapes = (), ()
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.add_annotation(text=empty, showarrow=False, font=dict(color="gray"), x=0.5, y=0.5, xref="paper",
                           yref="paper")
    return fig


def empty_figure(title: str, words: str) -> go.Figure:
    """A figure's empty state: its title and what will appear there (a page's first draw, before any data)."""
    return _layout(go.Figure(), title, "", "", words)


def has_points(fig: go.Figure) -> bool:
    """Whether any trace has a value to draw (a trace of no values, or only None, draws bare axes)."""
    return any(trace_has_points(trace) for trace in fig.data)


def trace_has_points(trace) -> bool:
    return any(v is not None for v in _values(trace))


def _values(trace) -> list:
    """A trace's drawn values: a heatmap's cells, a horizontal bar's x, otherwise y."""
    if getattr(trace, "z", None) is not None:
        return [v for row in trace.z for v in (row if isinstance(row, (list, tuple)) else [row])]
    return list((trace.x if getattr(trace, "orientation", None) == "h" else trace.y) or ())


def throughput_figure(result: RunResult) -> go.Figure:
    """Output tok/s over time, per second: one panel per user level, both engines over the same axis (seconds
    since that engine's level began: levels run one engine after the other, so on one time axis they never meet)."""
    users = list(dict.fromkeys(lvl.users for lvl in result.levels if lvl.records))
    fig = make_subplots(rows=1, cols=max(1, len(users)), shared_yaxes=True,
                        subplot_titles=[f"{u} user{'s' if u > 1 else ''}" for u in users] or None)
    for col, level_users in enumerate(users, 1):
        for lvl in (lvl for lvl in result.levels if lvl.users == level_users and lvl.records):
            series = lvl.throughput()
            fig.add_trace(go.Scatter(x=[x for x, _ in series], y=[y for _, y in series],
                                     mode="lines" if len(series) > 1 else "markers",  # a level under 1 s: one point
                                     name=_label(lvl.engine), legendgroup=lvl.engine,
                                     showlegend=col == 1 and lvl.repeat == 0, opacity=1.0 if lvl.repeat == 0 else 0.5,
                                     line=dict(color=ENGINE_COLORS.get(lvl.engine))), row=1, col=col)
    return _layout(fig, "Output tok/s over time, level by level<br><sup>x: seconds since each level began</sup>",
                   "", "tok/s", EMPTY_WORDS["throughput"])


def step_line(xs: Sequence[float], ys: Sequence, **style) -> go.Scatter:
    """A step line over per-sample values (one per engine step), thinned to MAX_POINTS: each kept point
    holds the highest value of the samples it stands for, so no peak is lost."""
    xs, ys = thinned(xs, ys)
    return go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", **style)


def thinned(xs: Sequence[float], ys: Sequence) -> tuple[Sequence[float], Sequence]:
    """At most MAX_POINTS of a line's points: every k-th x, with the highest y of the k samples it stands for."""
    if len(xs) <= MAX_POINTS:
        return xs, ys
    size = -(-len(xs) // MAX_POINTS)
    return xs[::size], [max((v for v in ys[i:i + size] if v is not None), default=None)
                        for i in range(0, len(ys), size)]


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
    """Leave room above the tallest bar (or whisker) for its printed value."""
    top = max((v for v in values if v is not None), default=0)
    if top > 0:
        fig.update_yaxes(range=[0, top * 1.3])
    return fig


def engine_spreads(summary: dict, engine: str) -> list[tuple[int, Spread]]:
    """(users, output tok/s over the repeats that finished a request) of one engine in a summary.json dict, by user
    level (a level that finished nothing has no tok/s to draw, not a 0)."""
    measured = [r for r in summary["runs"] if r.get("completed")]
    return sorted((users, found) for (name, users), found in tok_s_spreads(measured).items() if name == engine)


def _error_bars(spreads: Sequence[Spread]) -> dict | None:
    """Plotly error bars from each mean to its min and max, when some level was repeated."""
    if all(s.n == 1 for s in spreads):
        return None
    return dict(type="data", symmetric=False, array=[s.high - s.mean for s in spreads],
                arrayminus=[s.mean - s.low for s in spreads], color="#333", thickness=1.2)


def level_bars(runs: list[dict], engine: str) -> list[tuple[int, Spread | None, str]]:
    """(users, output tok/s over the repeats that finished a request, state) of one engine's levels, in run
    order; the state is '' for a level finished ok, else running, cancelled or failed."""
    levels = []
    for users in dict.fromkeys(r["users"] for r in runs if r["engine"] == engine):
        rows = [r for r in runs if r["engine"] == engine and r["users"] == users]
        found = tok_s_spreads([r for r in rows if r.get("completed")]).get((engine, users))
        states = [str(r.get("status", "ok")) for r in rows if r.get("status", "ok") != "ok"]
        levels.append((users, found, "running" if "running" in states else (states[0] if states else "")))
    return levels


def _bar_text(found: Spread | None, state: str) -> str:
    """A bar's printed value: its tok/s, the level's state beside it, or the state alone (never a made-up 0)."""
    if found is None or state == "running":
        return state or "none finished"
    return f"{found.mean:.0f}" + (f" ({state})" if state else "")


def tok_s_bars(summary: dict) -> go.Figure:
    """Output tok/s per user level, grouped by engine (the mean of the repeats, whiskers min to max); a level
    still running is drawn as running, one stopped early with what it measured (hatched)."""
    fig = go.Figure()
    for engine in summary["engines"]:
        levels = level_bars(summary["runs"], engine)
        spreads = [found or Spread(1, 0.0, 0.0, 0.0) for _, found, _ in levels]
        fig.add_trace(go.Bar(x=[str(u) for u, _, _ in levels], y=[s.mean for s in spreads],
                             error_y=_error_bars(spreads), name=_label(engine), cliponaxis=False,
                             marker=dict(color=ENGINE_COLORS.get(engine),
                                         pattern_shape=["/" if state else "" for _, _, state in levels]),
                             text=[_bar_text(found, state) for _, found, state in levels], textposition="outside"))
    fig.update_layout(barmode="group")
    _headroom(fig, [s.high for s in tok_s_spreads(summary["runs"]).values()])
    title = "Output tok/s per user level"
    title += "".join(f"<br><sup>{note}</sup>" for note in contrast_notes(summary["engines"]))
    return _layout(fig, title, "concurrent users", "tok/s", EMPTY_WORDS["bars"])


def contrast_notes(engines: Sequence[str]) -> list[str]:
    """What the gap between two engines' bars measures, for each engine whose entry names a contrast with another
    engine that ran beside it."""
    contrasts = [engine_spec(n).contrast for n in engines]
    return [words for against, words in filter(None, contrasts) if against in engines]


def ratio_bars(summary: dict) -> go.Figure:
    """The improvement ratio vLLM/HF per user level, with the value printed, whiskers over the repeats'
    ratios, and a star on levels with too few requests to trust."""
    thin, tops, shown = set(thin_levels(summary["runs"])), [1.0], set()
    fig = go.Figure()
    for key, ratio in (summary.get("ratios") or {BASELINE: summary.get("ratio", {})}).items():
        top, base = ratio_from_key(key)
        spreads, users = ratio_spreads(summary["runs"], base, top), sorted(ratio, key=int)
        fig.add_trace(go.Bar(x=[str(u) for u in users], y=[ratio[u] for u in users],
                             name=f"{short_label(top)} / {short_label(base)}", cliponaxis=False,
                             error_y=_error_bars([spreads[int(u)] for u in users]) if users else None,
                             text=[f"{ratio[u]:.2f}x" + ("*" if int(u) in thin else "") for u in users],
                             textposition="outside", marker_color=engine_spec(base).ratio_color or None))
        tops += [s.high for s in spreads.values()] + list(ratio.values())
        shown |= {int(u) for u in users}
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(barmode="group")
    pairs = [ratio_from_key(key) for key in summary.get("ratios") or {BASELINE: 0}]
    top = pairs[0][0] if pairs else RATIO_TOP
    bases = " and ".join(short_label(b) for _, b in pairs) or "HF"
    title = f"Improvement ratio {short_label(top)} / {bases} (output tok/s)"
    if thin & shown:
        title += f"<br><sup>* under {TRUSTED_REQUESTS} requests per engine: noisy; raise requests or repeats</sup>"
    _headroom(fig, tops)
    return _layout(fig, title, "concurrent users", "ratio", EMPTY_WORDS["ratio"])


def vllm_kv_figure(result: RunResult) -> go.Figure:
    """vLLM KV blocks used (1 - free/total, vLLM's own stat) vs total, over vLLM's own levels laid end to end (the
    other engines' turns left out, so that a short vLLM level is not a few seconds of a long run's axis)."""
    info = result.engine_info.get("vllm")
    xs, ys = vllm_time(result)
    fig = go.Figure()
    if xs:
        fig.add_trace(step_line(xs, ys, name="blocks used", line=dict(color=ENGINE_COLORS["vllm"])))
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[info.kv_total_blocks] * 2 if info else [None, None],
                                 mode="lines", name="blocks total", line=dict(dash="dash", color="gray")))
    empty = EMPTY_WORDS["vllm_kv"] if "vllm" in result.plan.engines else "vLLM is not in this run."
    return _layout(fig, pool_title(result), "seconds of vLLM's levels, end to end", "blocks", empty)


def vllm_time(result: RunResult) -> tuple[list[float], list[int]]:
    """vLLM's samples on its own clock: each of its levels from its first sample, after the one before it."""
    xs, ys, offset = [], [], 0.0
    for level in (lvl for lvl in result.levels if lvl.engine == "vllm" and lvl.samples):
        start = level.samples[0].time_s
        xs += [offset + s.time_s - start for s in level.samples]
        ys += [used_blocks(s) for s in level.samples]
        offset = xs[-1]
    return xs, ys


def pool_title(result: RunResult) -> str:
    """The KV plot's title: the pool's blocks, and how it was sized when the lab sized it (read back from the
    engine args, where the memory plan's sizing is recorded)."""
    info = result.engine_info.get("vllm")
    if info is None or not info.kv_total_blocks:
        return "vLLM KV-cache blocks"
    title = f"vLLM KV-cache blocks: {info.kv_total_blocks} blocks x {info.kv_block_size} tokens"
    sized_by = (info.args.get("source") or {}).get("num_kv_blocks")
    return title + (f" ({DEMO_SIZED})" if sized_by == DEMO_SIZED else "")


def kv_tokens_figure(result: RunResult) -> go.Figure:
    """Both engines' KV cache in one unit (tokens), over run time: what each holds, and the part of it
    holding the requests' real tokens. HF holds batch x padded length (its reserved bytes / bytes per
    token); vLLM holds its used blocks x block size (its own statistic); real = prompt + output so far."""
    fig = go.Figure()
    for engine in result.plan.engines:
        series = _kv_series(result, engine)
        if not series:
            continue
        label, color = short_label(engine), ENGINE_COLORS.get(engine)
        xs = [row[0] - result.origin_s for row in series]
        fig.add_trace(step_line(xs, [row[1] for row in series], name=f"{label}: held", line=dict(color=color)))
        fig.add_trace(step_line(xs, [row[2] for row in series], name=f"{label}: real tokens",
                                line=dict(color=color, dash="dot")))
    return _shared_span(_layout(fig, "KV cache held vs holding real tokens, both engines", "seconds since run start",
                                "tokens", EMPTY_WORDS["kv_tokens"]), result)


def _kv_series(result: RunResult, engine: str) -> list[tuple]:
    """(time, held tokens, real tokens, ...) of one engine over its levels (lab.metrics.kv's definitions)."""
    info = result.engine_info.get(engine)
    return [row for lvl in result.levels if lvl.engine == engine for row in lvl.kv_held(info)]


def queue_figure(result: RunResult) -> go.Figure:
    """Requests running and waiting inside each engine, over time."""
    fig = go.Figure()
    for engine in result.plan.engines:
        samples = [s for lvl in result.levels if lvl.engine == engine for s in lvl.samples]
        if not samples:
            continue
        xs = [s.time_s - result.origin_s for s in samples]
        color, label = ENGINE_COLORS.get(engine), short_label(engine)
        fig.add_trace(step_line(xs, [s.running for s in samples], name=f"{label}: running", line=dict(color=color)))
        fig.add_trace(step_line(xs, [s.waiting for s in samples], name=f"{label}: waiting",
                                line=dict(color=color, dash="dot")))
    return _shared_span(_layout(fig, "Requests running / waiting", "seconds since run start", "requests",
                                EMPTY_WORDS["queue"]), result)


def latency_table(summary: dict) -> pd.DataFrame:
    """TTFT, TPOT and E2E p50/p90/p99 per engine and level (milliseconds), with tok/s and errors."""
    rows = []
    for r in summary["runs"]:
        row = {"engine": r["engine"], "users": r["users"], "repeat": r.get("repeat", 0) + 1,
               "status": r.get("status", ""),
               "done": r.get("completed", r["requests"]), "errors": r["errors"],
               "out tok/s": round(r["output_tok_s"], 1)}
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            for q in ("p50", "p90", "p99"):
                value = r[metric][q]
                row[f"{metric[:-2].upper()} {q}"] = None if value is None else round(value * 1000, 1)
        rows.append(row)
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def compare_figure(summaries: Sequence[dict]) -> go.Figure:
    """Output tok/s per user level for several stored runs side by side."""
    fig = go.Figure()
    for index, s in enumerate(summaries):  # each engine keeps its colour; each run gets its own pattern
        for engine in s["engines"]:
            levels = engine_spreads(s, engine)
            fig.add_trace(go.Bar(x=[str(u) for u, _ in levels], y=[found.mean for _, found in levels],
                                 error_y=_error_bars([found for _, found in levels]),
                                 name=f"{s['run_id'][:6]} {engine} ({s['workload']})",
                                 marker=dict(color=ENGINE_COLORS.get(engine),
                                             pattern_shape=PATTERNS[index % len(PATTERNS)])))
    fig.update_layout(barmode="group")
    return _layout(fig, "Output tok/s: runs compared", "concurrent users", "tok/s",
                   "Choose runs above: their output tok/s appear here.")


def compare_ratio_figure(summaries: Sequence[dict]) -> go.Figure:
    """The vLLM/HF ratio per user level for several stored runs."""
    fig = go.Figure()
    for s in summaries:
        users = sorted(s.get("ratio", {}), key=int)
        fig.add_trace(go.Scatter(x=users, y=[s["ratio"][u] for u in users], mode="lines+markers+text",
                                 text=[f"{s['ratio'][u]:.2f}x" for u in users], textposition="top center",
                                 cliponaxis=False,
                                 name=f"{s['run_id'][:6]} ({s['workload']}, {s['device'].get('name', '')})"))
    _headroom(fig, [v for s in summaries for v in s.get("ratio", {}).values()])
    return _layout(fig, "Ratio vLLM / HF: runs compared", "concurrent users", "ratio",
                   "Choose runs above: their vLLM / HF ratios appear here.")


NO_TURNS = EMPTY_WORDS["turns"]


def turn_ttft_figure(summary: dict) -> go.Figure:
    """TTFT p50 per turn number of a chat run, one line per engine and user level (first repeat); each point's
    text is the share of its prompt the engine's prefix cache served, where the engine reports one."""
    fig = go.Figure()
    lines: dict[tuple[str, int], list[dict]] = {}
    for row in summary.get("turns") or []:
        if row["repeat"] == 0 and row["ttft_p50_s"] is not None:
            lines.setdefault((row["engine"], row["users"]), []).append(row)
    for (engine, users), rows in lines.items():
        hits = [f"{r['prefix_hit_rate']:.0%}" if r["prefix_hit_rate"] is not None else "" for r in rows]
        fig.add_trace(go.Scatter(
            x=[r["turn"] for r in rows], y=[r["ttft_p50_s"] * 1000 for r in rows], mode="lines+markers+text",
            text=hits, textposition="top center", name=f"{short_label(engine)}, {users} users",
            line=dict(color=ENGINE_COLORS.get(engine)),
            customdata=[[r["prompt_tokens_mean"], r["requests"]] for r in rows],
            hovertemplate="turn %{x}: TTFT p50 %{y:.0f} ms<br>prompt %{customdata[0]:.0f} tokens, "
                          "%{customdata[1]} requests<br>prefix-cache hits %{text}<extra></extra>"))
    fig.update_xaxes(dtick=1)
    title = "TTFT p50 per turn (each turn re-sends the history)<br><sup>point labels: share of the prompt " \
            "served from the prefix cache (engines that report it)</sup>"
    return _layout(fig, title, "turn", "TTFT p50 (ms)", NO_TURNS)
