"""A stored result as one self-contained HTML page to hand out: a run, an experiment (the why ladder is one), a
sweep or a capacity search, each page picked by the result's kind (``PAGES``).

A run's page holds its facts, computed sentences, the room's predictions (where the run kept some), figures, the
factors of its ratio, the latency table, the spread over repeats, the agreement check, engine args, device and
versions, from its summary.json and requests.csv alone; an experiment's, the figure the KV cache or Why tab draws
for it (lab.plots.kv, whose ``experiment_figure`` draws the ladder too), its sentences, fields (a ladder: its factors
and rungs), parameters, engine args, device and versions; a sweep's, the Sweeps tab's figure (lab.plots.sweep), its
sentences, points and load; a capacity search's, its sentences, figure and probes. Values are tables rounded for a
reader (lab.report.html); a figure or panel with nothing to draw is left out. Plotly's JavaScript is written into
the page once, before its first figure (no CDN), so the file opens in a browser with no network; a long line keeps
MAX_POINTS points (peaks kept, as on the live page), so a page stays under 5 MB. The figures over time of a run need
the engines' samples, which a stored run does not keep, and are left out.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from lab.engines.registry import label
from lab.experiments import EXPERIMENTS, stored_fields
from lab.experiments.answers import experiment_answer
from lab.metrics import Spread, ratio_pairs, ratio_spreads, tok_s_spreads
from lab.metrics.levels_words import ratio_caption
from lab.metrics.steps_words import FACTORS_TITLE, factors_lines, factors_rows
from lab.metrics.turns_words import chat_answer
from lab.plots import (
    _layout,
    has_points,
    latency_table,
    ratio_bars,
    thinned,
    tok_s_bars,
    trace_has_points,
    turn_ttft_figure,
)
from lab.plots.capacity import capacity_figure
from lab.plots.kv import experiment_figure
from lab.plots.predict import room_figure
from lab.plots.sweep import sweep_figure
from lab.plots.why import factors_table
from lab.predictions import RATIO, room_sentence, step_counts, times
from lab.report.html import (
    NOT_SET,
    Code,
    bullets,
    columns_table,
    decimal,
    esc,
    fields_table,
    page,
    pairs_table,
    prose,
    section,
    table,
    when,
)
from lab.sweeps.words import sweep_answer
from lab.words import users_words

FIGURE = "<div class='fig'>"
FLAGS = "what makes the upper rung"  # the factors table's column of command-line flags, shown as code
LENGTH_BINS = 40  # bars of the request-length histogram: its size stays the same however many requests ran


def report_page(kind: str, data: dict, requests: pd.DataFrame) -> str:
    """The page of a stored result of ``kind`` (a TaskResult KIND); ``requests``: a run's requests.csv."""
    if kind not in PAGES:
        raise ValueError(f"no report for a result of kind {kind!r}; kinds with one: {', '.join(PAGES)}")
    return PAGES[kind](data, requests)


# -- one page per kind ------------------------------------------------------------------------------------------
def report_html(summary: dict, requests: pd.DataFrame) -> str:
    """The whole page for one run."""
    parts = [pairs_table(facts(summary)), prose([ratio_caption(summary)]),
             predictions_html(summary, summary["run_id"]), figure_div(tok_s_bars(summary)),
             figure_div(ratio_bars(summary)), factors_html(summary), turns_html(summary),
             figure_div(lengths_figure(requests)),
             section("Latency (ms) per engine and user level (measured)", latency_html(summary)),
             section("Output tok/s over repeats (measured)", spread_html(summary)),
             section("Do the engines compute the same thing?", agreement_html(summary.get("agreement") or [])),
             engine_args_html(summary), where_it_ran(summary)]
    return document(f"KV Lab run {summary['run_id']}", parts)


def experiment_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored experiment (experiment.json's dict; explain.json's for the why ladder; a capacity
    search run from the page gets the CLI's capacity page)."""
    name, fields = data["experiment"], stored_fields(data)
    if name == "capacity_search":
        from lab.capacity.stored import as_capacity

        return capacity_html(as_capacity(data), requests)
    drawn = experiment_figure(SimpleNamespace(experiment=name, fields=fields, series=data.get("series") or {}))
    parts = [prose([EXPERIMENTS.get(name, "")]), pairs_table(experiment_facts(data)),
             prose(experiment_answer(name, fields, data.get("params") or {})),
             predictions_html(data, data["experiment_id"]), figure_div(drawn)]
    parts += ladder_parts(fields) if name == "why" else [section("Measured fields", fields_table(
        {k: v for k, v in fields.items() if k not in ("caption", "predictions")}))]
    parts += [section("Parameters", fields_table(data.get("params") or {}, NOT_SET)), engine_args_html(data),
              where_it_ran(data)]
    title = "why ladder (lab explain)" if name == "why" else f"experiment {name}"
    return document(f"KV Lab {title} {data['experiment_id']}", parts)


def sweep_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored sweep (sweep.json's dict): the Sweeps tab's figure and points, and its sentences."""
    parts = [pairs_table(sweep_facts(data)), prose(sweep_answer(data)), figure_div(sweep_figure(data)),
             section("One row per finished value (as sweep.csv; engine_arg: the setting as the engine reported it)",
                     table(data.get("points") or [])),
             section("Load", fields_table(data.get("load") or {}, NOT_SET)), where_it_ran(data)]
    return document(f"KV Lab sweep of {data['knob']} {data['sweep_id']}", parts)


def capacity_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored capacity search (capacity.json's dict): its sentences, each target's percentile
    against the level with the limit drawn, and every probe."""
    from lab.capacity import capacity_answer, probe_rows

    facts_rows = {"targets": data["slo"], "search": "open-loop rate" if data["mode"] == "rate" else "closed-loop users",
                  "engines": ", ".join(label(e) for e in data["engines"]), **ended(data), "model": data.get("model"),
                  "device": device_name(data)}
    parts = [pairs_table(facts_rows), prose(capacity_answer(data)), figure_div(capacity_figure(data)),
             section("Every probe (latencies in ms; L/target: Little's law, computed)", table(probe_rows(data))),
             section("Capacity per engine (each level's verdict: the probes above)",
                     columns_table(data.get("capacity") or {}, "", "none", skip=("levels",))),
             section("Settings", fields_table(data.get("settings") or {}, NOT_SET)), engine_args_html(data),
             where_it_ran(data)]
    return document(f"KV Lab capacity search {data['capacity_id']}", parts)


PAGES = {"run": report_html, "experiment": experiment_html, "sweep": sweep_html,
         "capacity": capacity_html}  # TaskResult.KIND -> its page


def document(title: str, parts: list[str]) -> str:
    """The page, with plotly's JavaScript written once, just before its first figure (none without a figure)."""
    first = next((i for i, part in enumerate(parts) if FIGURE in part), None)
    if first is not None:
        parts = [*parts[:first], plotly_script(), *parts[first:]]
    return page(title, parts)


def plotly_script() -> str:
    return ("<script>window.PlotlyConfig={MathJaxConfig:'local'};</script>"
            f"<script charset='utf-8'>{get_plotlyjs()}</script>")


# -- facts ------------------------------------------------------------------------------------------------------
def facts(summary: dict) -> dict:
    """What ran, where and how it ended."""
    load = summary.get("load", {})
    took = summary.get("wall_s")
    return {**ended(summary), "took (measured)": f"{decimal(took)} s" if took else None, "model": summary.get("model"),
            "device": device_name(summary), "engines": ", ".join(label(e) for e in summary["engines"]),
            "workload": summary["workload"], "users": ", ".join(map(str, summary["users"])),
            "requests per user": load.get("requests_per_user"), "seconds per level": load.get("duration_s"),
            "output length": load.get("output_len") or "the workload's", "repeats": load.get("repeats"),
            "seed": load.get("seed")}


def experiment_facts(data: dict) -> dict:
    """An experiment's name, how it ended, and where it ran."""
    return {"experiment": data["experiment"], **ended(data), "model": data.get("model"), "device": device_name(data)}


def sweep_facts(data: dict) -> dict:
    """A sweep's knob and values, how it ended, where it ran and the load each value ran."""
    load = data.get("load") or {}
    return {"knob": f"{data['knob']} ({data.get('engine')})", "values": ", ".join(map(str, data.get("values", []))),
            **ended(data), "model": data.get("model"), "device": device_name(data),
            "users": ", ".join(map(str, load.get("users", []))), "workload": load.get("workload"),
            "requests per user": load.get("requests_per_user"), "output length": load.get("output_len") or
            "the workload's", "repeats": load.get("repeats")}


def ended(data: dict) -> dict:
    """Status (with the error, if any), start and end of any stored result."""
    return {"status": data["status"] + (f" ({data['error']})" if data.get("error") else ""),
            "started": when(data.get("started_at")), "ended": when(data.get("ended_at"))}


def device_name(data: dict) -> str | None:
    """The device's name (a memory plan's experiment.json holds only the name)."""
    device = data.get("device")
    return (device.get("name") or device.get("kind")) if isinstance(device, dict) else device


def where_it_ran(data: dict) -> str:
    """The device's fields and the versions, side by side."""
    device = data.get("device")
    tables = [section(title, fields_table(value), 3) for title, value in
              (("Device", device if isinstance(device, dict) else {"name": device}),
               ("Versions", data.get("versions") or {}))]
    return section("Device and versions", f"<div class='pair'>{''.join(f'<div>{t}</div>' for t in tables if t)}</div>"
                   if any(tables) else "")


def engine_args_html(data: dict) -> str:
    """Each engine's args as it reported them, engines side by side."""
    return section("Engine args", columns_table(data.get("engine_args") or {}, "setting", NOT_SET))


# -- a run's sections -------------------------------------------------------------------------------------------
def factors_html(summary: dict) -> str:
    """Why the ratio, level by level: the factors' table and sentences (lab.metrics.steps_words), where the run has
    them."""
    rows = factors_rows(summary.get("factors") or {})
    if not rows:
        return ""
    return section(FACTORS_TITLE, table([dict(zip(rows[0], row, strict=True)) for row in rows[1:]])
                   + bullets(factors_lines(summary)))


def turns_html(summary: dict) -> str:
    """A chat run's TTFT per turn: the figure and its sentences."""
    drawn = figure_div(turn_ttft_figure(summary)) if summary.get("turns") else ""
    return section("Chat turns (measured)", drawn + bullets(chat_answer(summary)))


def latency_html(summary: dict) -> str:
    """The latency table; a level that finished no request shows '—' (not a 0), and the note says which and why."""
    rows = latency_table(summary).astype(object).to_dict("records")
    for row, run in zip(rows, summary["runs"], strict=True):
        if not run.get("completed"):
            row["out tok/s"] = None
    return table(rows, note=missing_note(summary["runs"]))


def missing_note(runs: list[dict]) -> str:
    """Why a row shows '—': the levels that finished no request (with how each ended), and those of one token."""
    none = [f"{level_words(r)} ({r.get('status') or 'ok'})" for r in runs if not r.get("completed")]
    single = [level_words(r) for r in runs if r.get("completed") and r["tpot_s"]["p50"] is None]
    said = ([f"{'; '.join(none)} finished no request, so measured no tok/s or latency"] if none else []) + \
           ([f"{'; '.join(single)} made one token per request: no time per output token"] if single else [])
    return f"— : not measured: {'; '.join(said)}." if said else ""


def level_words(run: dict) -> str:
    repeat = f", repeat {run['repeat'] + 1}" if run.get("repeat") else ""
    return f"{label(run['engine'])} at {users_words(run['users'])}{repeat}"


def spread_html(summary: dict) -> str:
    """Output tok/s of each engine and each ratio per level over its repeats (from the levels that finished a
    request); nothing where every level ran once (the figures hold its one value)."""
    measured = [r for r in summary["runs"] if r.get("completed")]
    tok = tok_s_spreads(measured)
    columns = {f"{label(e)} tok/s": {u: found for (name, u), found in tok.items() if name == e}
               for e in summary["engines"]}
    columns |= {f"{label(top)}/{label(base)}": ratio_spreads(measured, base, top)
                for top, base in ratio_pairs(summary["engines"])}
    if all(found.n < 2 for by_users in columns.values() for found in by_users.values()):
        return ""
    levels = sorted({u for by_users in columns.values() for u in by_users})
    rows = [{"users": u} | {name: spread_text(by_users.get(u)) for name, by_users in columns.items()} for u in levels]
    gaps = any(value is None for row in rows for value in row.values())
    return table(rows, note="mean (lowest-highest, n: repeats that finished a request)"
                            + ("; —: no repeat of that level finished a request" if gaps else ""))


def spread_text(found: Spread | None) -> str | None:
    if found is None:
        return None
    if found.n < 2:
        return decimal(found.mean)
    return f"{decimal(found.mean)} ({decimal(found.low)}-{decimal(found.high)}, n={found.n})"


def lengths_figure(requests: pd.DataFrame) -> go.Figure:
    """Prompt and output tokens of the first engine's requests (every engine got the same ones), counted in
    LENGTH_BINS bins shared by both."""
    fig = go.Figure()
    if not requests.empty and {"prompt_tokens", "output_tokens"} <= set(requests.columns):
        first = requests[requests["engine"] == requests["engine"].iloc[0]]
        columns = {"prompt tokens": first["prompt_tokens"].dropna(), "output tokens": first["output_tokens"].dropna()}
        edges = np.histogram_bin_edges(pd.concat(list(columns.values())), bins=LENGTH_BINS)
        for name, values in columns.items():
            counts, _ = np.histogram(values, edges)
            fig.add_trace(go.Bar(x=((edges[:-1] + edges[1:]) / 2).round(1).tolist(), y=counts.tolist(), name=name,
                                 width=float(edges[1] - edges[0]), opacity=0.7))
        fig.update_layout(barmode="overlay", bargap=0)
    return _layout(fig, "Request lengths (tokens, as sent)", "tokens", "requests")


def agreement_html(pairs: list[dict]) -> str:
    """The start-up agreement check: each engine pair's verdict and its prompts' identical leading tokens."""
    if not pairs:
        return "<p>Not checked in this run.</p>"
    parts = []
    for pair in pairs:
        verdict = pair.get("skipped") or {True: "agree", False: "DIFFER", None: "not decided"}[pair.get("ok")]
        rows = [{"prompt": p["prompt"], "identical tokens": f"{p['matched_tokens']}/{p['total_tokens']}",
                 "first divergence": p["diverged_at"] if p["diverged_at"] is not None else "none"}
                for p in pair.get("prompts", [])]
        parts.append(f"<p><b>{esc(pair['other'])} against {esc(pair['reference'])}</b>: {esc(verdict)}</p>"
                     + table(rows))
    return "".join(parts)


# -- the room's predictions -------------------------------------------------------------------------------------
def predictions_html(data: dict, task_id: str) -> str:
    """The room's predictions kept with a task (lab.predictions): the sentence, the histogram and the median
    against the measured answer; nothing where the task kept none or nobody answered."""
    stored = data.get("predictions")
    if not stored or not stored.get("values"):
        return ""
    view = stored | {"task_id": task_id, "ended": True}
    return section("The room's predictions", prose([room_sentence(view)]) + figure_div(room_figure(view))
                   + predictions_table(view))


def predictions_table(view: dict) -> str:
    """A ratio: the room's median and range against the measured ratio; a step: how many chose each step."""
    values, measured = view["values"], view["measured"]
    if view["kind"] == RATIO:
        return table([{"predictions": len(values), "room's median": times(statistics.median(values)),
                       "lowest": times(min(values)), "highest": times(max(values)),
                       "measured": times(measured) if measured else None}],
                     note="" if measured else "—: the run measured no vLLM/HF ratio at its top level")
    return table([{"step": step, "predictions": n, "measured largest": step == measured}
                  for step, n in step_counts(values, view.get("choices") or []).items()])


# -- a why ladder's sections ------------------------------------------------------------------------------------
def ladder_parts(fields: dict) -> list[str]:
    """A ladder's factors, its load, each level's rungs and each rung's engine args, and how it computes."""
    levels = fields.get("levels") or {str(fields.get("load", {}).get("users", "")): fields}
    rungs = [section(f"Rungs at {users_words(int(users))} (measured)" if users.isdigit() else "Rungs (measured)",
                     table([rung_row(name, rung) for name, rung in level.get("rungs", {}).items()]), 3)
             for users, level in sorted(levels.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)]
    first = next(iter(levels.values()), {}).get("rungs", {})
    load = {k: fields[k] for k in ("preset", "preset_words", "load", "repeats", "budget") if k in fields}
    factors = [row | {FLAGS: Code(row[FLAGS])} for row in factors_table(fields).astype(object).to_dict("records")]
    return [section("Factors", table(factors)),
            section("Load", fields_table(load, NOT_SET)), section("Rungs", "".join(rungs)),
            section("Engine args per rung", columns_table({n: r.get("args") for n, r in first.items()}, "setting",
                                                          NOT_SET)),
            section("Method", prose([fields.get("method", "")]))]


def rung_row(name: str, rung: dict) -> dict:
    """One rung of one level: what it is, whether it ran, its tok/s per repeat, median TPOT and peak running."""
    return {"rung": name, "what": rung.get("label"),
            "status": rung.get("status", "") + (f": {rung['reason']}" if rung.get("reason") else ""),
            "tok/s per repeat": rung.get("tok_s") or None, "TPOT median (ms)": rung.get("tpot_ms_median"),
            "peak running": rung.get("peak_running") or None, "warm-up (s)": rung.get("warmup_s")}


# -- figures ----------------------------------------------------------------------------------------------------
def figure_div(fig: go.Figure) -> str:
    """One figure (plotly's JavaScript is the page's), its long lines thinned and its empty panels left out;
    nothing for a figure with nothing to draw."""
    fig = without_empty_panels(thin_lines(fig))
    if not has_points(fig):
        return ""
    return f"{FIGURE}{fig.to_html(full_html=False, include_plotlyjs=False)}</div>"


def thin_lines(fig: go.Figure) -> go.Figure:
    """Every line longer than MAX_POINTS thinned as the live page thins it (lab.plots.thinned: peaks kept)."""
    for trace in fig.data:
        if trace.type == "scatter" and "lines" in (trace.mode or "lines") and trace.x is not None \
                and trace.y is not None:
            trace.x, trace.y = thinned(list(trace.x), list(trace.y))
    return fig


def without_empty_panels(fig: go.Figure) -> go.Figure:
    """A figure of several panels without those that have nothing to draw (their axes, titles, lines and traces);
    a panel left alone on its row takes the row's width. A figure whose panels are all empty is left as it is."""
    layout = fig.layout.to_plotly_json()
    panels = [key[5:] for key in layout if key.startswith("xaxis")]
    if len(panels) < 2 or any(f"yaxis{p}" not in layout for p in panels):
        return fig
    drawn = {(t.xaxis or "x")[1:] for t in fig.data if trace_has_points(t)}
    empty = [p for p in panels if p not in drawn]
    if not empty or len(empty) == len(panels):
        return fig
    data = fig.to_dict()
    for panel in empty:
        drop_panel(data, panel)
    widen_alone(data["layout"])
    return go.Figure(data)


def drop_panel(data: dict, panel: str) -> None:
    """Remove one panel (axes ``xaxis{panel}``/``yaxis{panel}``) from a figure's dict: its traces, its shapes, and
    the subplot title over it."""
    layout = data["layout"]
    x, y = layout.pop(f"xaxis{panel}"), layout.pop(f"yaxis{panel}")
    data["data"] = [t for t in data["data"] if (t.get("xaxis") or "x")[1:] != panel]
    layout["shapes"] = [s for s in layout.get("shapes", []) if str(s.get("xref", "")).split()[0] != f"x{panel}"]
    layout["annotations"] = [a for a in layout.get("annotations", [])
                             if not title_over(a, x.get("domain", (0, 1)), y.get("domain", (0, 1))[1])]


def title_over(note: dict, across: tuple, top: float) -> bool:
    """Whether an annotation is the subplot title of a panel spanning ``across`` (centred over it, at its ``top``)."""
    x0, x1 = across
    return note.get("xref") == "paper" and x0 <= note.get("x", -1) <= x1 and abs(note.get("y", -1) - top) < 1e-6


def widen_alone(layout: dict) -> None:
    """A panel alone on its row (same y domain as no other) spans the row; its title moves to the middle."""
    rows: dict[tuple, list[str]] = {}
    for key in (k for k in layout if k.startswith("xaxis")):
        rows.setdefault(tuple(layout.get(f"yaxis{key[5:]}", {}).get("domain", (0, 1))), []).append(key)
    for (_, top), keys in rows.items():
        if len(keys) == 1:
            across = layout[keys[0]].get("domain", (0, 1))
            layout[keys[0]]["domain"] = [0, 1]
            for note in (n for n in layout.get("annotations", []) if title_over(n, across, top)):
                note["x"] = 0.5
