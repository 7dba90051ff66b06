"""The why ladder's figure (output tok/s per rung with its repeats' range, each step's factor over it) and its
factors table.

Log scale, so that each step's height is its factor and the chain's steps stack up to the whole ratio. Chain
rungs are drawn in one colour, side rungs (set against one chain rung, outside the product) in another.
Every number drawn comes from the ladder's result (lab.experiments.why).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lab.experiments.ladder import CHAIN, RUNGS, geo_mean
from lab.plots import _layout

CHAIN_COLOR, SIDE_COLOR = "#17bebb", "#a5668b"


def ladder_figure(result) -> go.Figure:
    """The figure of a ladder's result (an ExperimentResult, live or ended)."""
    return fields_figure(result.fields)


def fields_figure(fields: dict) -> go.Figure:
    """A ladder of several finished levels: its factors across users (levels_figure); else the rungs' bars."""
    levels = {u: lv for u, lv in fields.get("levels", {}).items() if lv.get("total")}
    return levels_figure(fields, levels) if len(levels) > 1 else rungs_figure(fields)


def levels_figure(fields: dict, levels: dict) -> go.Figure:
    """Each chain step's factor and the total against users (log scale: a step's line is its share of the lead),
    with the identity's factors of hf -> vllm (tokens per step, time per step) dashed where the steps were timed."""
    users = sorted(levels, key=int)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=users, y=[levels[u]["total"]["value"] for u in users], name="vLLM / HF (total)",
                             mode="lines+markers", line=dict(color="#222", width=3)))
    steps = {f"{f['lower']} → {f['upper']}" for u in users for f in levels[u]["factors"]}
    for step in sorted(steps):
        found = [next((f["value"] for f in levels[u]["factors"] if f"{f['lower']} → {f['upper']}" == step), None)
                 for u in users]
        fig.add_trace(go.Scatter(x=users, y=found, name=step, mode="lines+markers"))
    for key, name in (("tokens_per_step", "tokens per step"), ("s_per_step", "1 / time per step")):
        found = [(levels[u].get("steps") or {}).get("factors", {}).get(key, {}).get("value") for u in users]
        if any(found):
            fig.add_trace(go.Scatter(x=users, y=found, name=f"hf → vllm: {name}", mode="lines+markers",
                                     line=dict(dash="dash")))
    fig = _layout(fig, f"Why, across users: each factor ({fields.get('preset', '')}; log scale)", "users",
                  "factor (x)")
    fig.update_yaxes(type="log")
    fig.update_xaxes(type="category")
    return fig


def rungs_figure(fields: dict) -> go.Figure:
    """Bars of each rung that ran (geometric mean over its repeats, whiskers to the lowest and highest), the
    chain's factors written between neighbouring rungs, from explain.json's fields (a stored ladder's too)."""
    fig = go.Figure()
    ran = {n: r["tok_s"] for n, r in fields.get("rungs", {}).items() if r["tok_s"]}
    if ran:
        names, means = list(ran), [geo_mean(v) for v in ran.values()]
        pairs = list(zip(ran.values(), means, strict=True))
        fig.add_trace(go.Bar(
            x=names, y=means, marker_color=[CHAIN_COLOR if n in CHAIN else SIDE_COLOR for n in names],
            error_y=dict(type="data", symmetric=False, array=[max(v) - m for v, m in pairs],
                         arrayminus=[m - min(v) for v, m in pairs]),
            text=[f"{m:,.1f}" for m in means], textposition="inside", name="output tok/s (measured)",
            hovertext=[fields["rungs"][n]["label"] for n in names]))
        for f in fields.get("factors", []):
            fig.add_annotation(x=f["upper"], y=1, yref="paper", yanchor="bottom", showarrow=False,
                               text=f"×{f['value']:.2f} vs {f['lower']}", font=dict(size=11))
    preset = fields.get("preset", "")
    fig = _layout(fig, f"Why: output tok/s per rung ({preset}; log scale, whiskers: repeats)", "rung",
                  "output tok/s")
    if ran:
        fig.update_yaxes(type="log")
        fig.update_layout(showlegend=False, margin=dict(l=50, r=20, t=80, b=60))
    return fig


COLUMNS = ["users", "step", "factor", "repeats", "mechanism", "in product", "what makes the upper rung"]


def factors_table(fields: dict) -> pd.DataFrame:
    """Each step at each level: lower -> upper, its factor and the repeats' range, the mechanism, whether it is in
    the product (a ladder of one level: that level's steps)."""
    levels = fields.get("levels") or {str(fields.get("load", {}).get("users", "")): fields}
    rows = [_step_row(users, f) for users in sorted(levels, key=lambda u: int(u) if u.isdigit() else 0)
            for f in levels[users].get("factors", []) + levels[users].get("sides", [])]
    return pd.DataFrame(rows, columns=COLUMNS)


def _step_row(users: str, f: dict) -> dict:
    return {"users": users, "step": f"{f['lower']} → {f['upper']}", "factor": round(f["value"], 2),
            "repeats": f"{f['low']:.2f}-{f['high']:.2f} (n={f['n']})", "mechanism": f["mechanism"],
            "in product": "yes" if f["in_product"] else "side", "what makes the upper rung": RUNGS[f["upper"]].flags}
