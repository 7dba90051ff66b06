"""A stored result as one self-contained HTML page to hand out: a run, an experiment (the why ladder is one) or a
sweep, each page picked by the result's kind (``PAGES``).

A run's page holds its figures, tables, sentences, agreement, engine args, device and spread, from its summary.json
and requests.csv alone; an experiment's, the figure the KV cache or Why tab draws for it (lab.plots_kv, whose
``experiment_figure`` draws the ladder too), its computed sentences, fields, parameters, engine args, device and
versions; a sweep's, the Sweeps tab's figure (lab.plots_sweep), its sentences, points, load, device and versions.
Plotly's JavaScript is written into the page once (``include_plotlyjs=True``, no CDN), so the file opens in a
browser with no network. Every sentence comes from lab.sentences, computed from the result. The figures over time
of a run need the engines' samples, which a stored run does not keep, and are left out.
"""

from __future__ import annotations

import html
import json
from types import SimpleNamespace

import pandas as pd
import plotly.graph_objects as go

from lab.experiments import EXPERIMENTS, stored_fields
from lab.plots import _layout, latency_table, ratio_bars, tok_s_bars, turn_ttft_figure
from lab.plots_capacity import capacity_figure
from lab.plots_kv import experiment_figure
from lab.plots_sweep import sweep_figure
from lab.plots_why import factors_table
from lab.sentences import chat_answer, experiment_answer, ratio_caption, sweep_answer
from lab.steps_words import FACTORS_TITLE, factors_lines, factors_rows

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#2a3f5f}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #dde;padding:3px 7px}"
         "pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px}.fig{margin:1em 0}")


def report_page(kind: str, data: dict, requests: pd.DataFrame) -> str:
    """The page of a stored result of ``kind`` (a TaskResult KIND); ``requests``: a run's requests.csv."""
    if kind not in PAGES:
        raise ValueError(f"no report for a result of kind {kind!r}; kinds with one: {', '.join(PAGES)}")
    return PAGES[kind](data, requests)


def report_html(summary: dict, requests: pd.DataFrame) -> str:
    """The whole page for one run."""
    figures = [tok_s_bars(summary), ratio_bars(summary), lengths_figure(requests)]
    if summary.get("turns"):
        figures.append(turn_ttft_figure(summary))
    parts = [facts(summary), sentences(summary)]
    parts += [figure_div(fig, index == 0) for index, fig in enumerate(figures)]
    parts += [section("Latency (ms) per engine and user level", latency_table(summary).to_html(index=False)),
              section("Spread over repeats", json_block(summary.get("spread"))),
              section("Do the engines compute the same thing?", agreement_html(summary.get("agreement") or [])),
              section("Engine args", json_block(summary.get("engine_args"))),
              where_it_ran(summary)]
    return page(f"KV Lab run {summary['run_id']}", parts)


def experiment_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored experiment (experiment.json's dict; explain.json's for the why ladder; a capacity
    search run from the page gets the CLI's capacity page)."""
    name, fields = data["experiment"], stored_fields(data)
    if name == "capacity_search":
        from lab.experiments.capacity_search import as_capacity

        return capacity_html(as_capacity(data), requests)
    drawn = experiment_figure(SimpleNamespace(experiment=name, fields=fields, series=data.get("series") or {}))
    parts = [f"<p>{esc(EXPERIMENTS.get(name, ''))}</p>", facts_table(experiment_facts(data)),
             paragraphs(experiment_answer(name, fields, data.get("params") or {})), figure_div(drawn, True)]
    if name == "why":
        parts.append(section("Factors", factors_table(fields).to_html(index=False)))
    parts += [section("Measured fields", json_block({k: v for k, v in fields.items() if k != "caption"})),
              section("Parameters", json_block(data.get("params"))),
              section("Engine args", json_block(data.get("engine_args"))), where_it_ran(data)]
    title = "why ladder (lab explain)" if name == "why" else f"experiment {name}"
    return page(f"KV Lab {title} {data['experiment_id']}", parts)


def sweep_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored sweep (sweep.json's dict): the Sweeps tab's figure and points, and its sentences."""
    points = pd.DataFrame(data.get("points") or []).round(3)
    parts = [facts_table(sweep_facts(data)), paragraphs(sweep_answer(data)), figure_div(sweep_figure(data), True),
             section("One row per finished value (as sweep.csv; engine_arg: the setting as the engine reported it)",
                     points.to_html(index=False)),
             section("Load", json_block(data.get("load"))), where_it_ran(data)]
    return page(f"KV Lab sweep of {data['knob']} {data['sweep_id']}", parts)


def capacity_html(data: dict, requests: pd.DataFrame | None = None) -> str:
    """The page of a stored capacity search (capacity.json's dict): its sentences, each target's percentile
    against the level with the limit drawn, and every probe."""
    from lab.capacity import capacity_answer, probe_rows

    facts_rows = {"targets": data["slo"], "search": "open-loop rate" if data["mode"] == "rate" else "closed-loop users",
                  "engines": ", ".join(data["engines"]), **ended(data), "model": data.get("model"),
                  "device": device_name(data)}
    parts = [facts_table(facts_rows), paragraphs(capacity_answer(data)), figure_div(capacity_figure(data), True),
             section("Every probe (latencies in ms; L/target: Little's law, computed)",
                     pd.DataFrame(probe_rows(data)).to_html(index=False)),
             section("Capacity per engine", json_block(data.get("capacity"))),
             section("Settings", json_block(data.get("settings"))),
             section("Engine args", json_block(data.get("engine_args"))), where_it_ran(data)]
    return page(f"KV Lab capacity search {data['capacity_id']}", parts)


PAGES = {"run": report_html, "experiment": experiment_html, "sweep": sweep_html,
         "capacity": capacity_html}  # TaskResult.KIND -> its page


def page(title: str, parts: list[str]) -> str:
    """One HTML document: the title as its heading, then ``parts``."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{esc(title)}</h1>{''.join(parts)}</body></html>")


def esc(value) -> str:
    return html.escape(str(value))


def section(title: str, body: str) -> str:
    return f"<h2>{esc(title)}</h2>{body}"


def json_block(value) -> str:
    return f"<pre>{esc(json.dumps(value, indent=2, default=str))}</pre>"


def figure_div(fig: go.Figure, with_js: bool) -> str:
    """One figure; the first carries plotly's JavaScript, inline."""
    return f"<div class='fig'>{fig.to_html(full_html=False, include_plotlyjs=with_js)}</div>"


def facts(summary: dict) -> str:
    """What ran, where and how it ended, as a small table."""
    load = summary.get("load", {})
    return facts_table({**ended(summary), "model": summary.get("model"), "device": device_name(summary),
                        "engines": ", ".join(summary["engines"]), "workload": summary["workload"],
                        "users": ", ".join(map(str, summary["users"])),
                        "requests per user": load.get("requests_per_user"), "seconds per level": load.get("duration_s"),
                        "output length": load.get("output_len") or "the workload's", "repeats": load.get("repeats"),
                        "seed": load.get("seed")})


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
            "started": data.get("started_at"), "ended": data.get("ended_at")}


def device_name(data: dict) -> str | None:
    """The device's name (a memory plan's experiment.json holds only the name)."""
    device = data.get("device")
    return device.get("name") if isinstance(device, dict) else device


def facts_table(rows: dict) -> str:
    """Rows of name and value, as a small table (a value of None is left out)."""
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows.items() if v is not None)
    return f"<table>{cells}</table>"


def where_it_ran(data: dict) -> str:
    return section("Device and versions", json_block({"device": data.get("device"), "versions": data.get("versions")}))


def sentences(summary: dict) -> str:
    """The lab's computed sentences about this run (the ratio caption, a chat run's turns)."""
    return paragraphs([ratio_caption(summary), *chat_answer(summary)]) + factors_html(summary)


def factors_html(summary: dict) -> str:
    """Why the ratio, level by level: the factors' table and sentences (lab.steps_words), where the run has them."""
    rows = factors_rows(summary.get("factors") or {})
    if not rows:
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return section(FACTORS_TITLE, f"<table><tr>{head}</tr>{body}</table>" + paragraphs(factors_lines(summary)))


def paragraphs(lines: list[str]) -> str:
    """Computed sentences, one paragraph each (the page's bold marks dropped)."""
    return "".join(f"<p>{esc(line.replace('**', ''))}</p>" for line in lines if line)


def lengths_figure(requests: pd.DataFrame) -> go.Figure:
    """Prompt and output tokens of the first engine's requests (every engine got the same ones)."""
    fig = go.Figure()
    if not requests.empty:
        first = requests[requests["engine"] == requests["engine"].iloc[0]]
        for column, name in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
            fig.add_trace(go.Histogram(x=first[column], name=f"{name} tokens", opacity=0.7, nbinsx=40))
        fig.update_layout(barmode="overlay")
    return _layout(fig, "Request lengths (tokens, as sent)", "tokens", "requests")


def agreement_html(pairs: list[dict]) -> str:
    """The start-up agreement check: each engine pair's verdict and its prompts' identical leading tokens."""
    if not pairs:
        return "<p>Not checked in this run.</p>"
    parts = []
    for pair in pairs:
        verdict = pair.get("skipped") or {True: "agree", False: "DIFFER", None: "not decided"}[pair.get("ok")]
        rows = "".join(f"<tr><td>{esc(p['prompt'])}</td><td>{p['matched_tokens']}/{p['total_tokens']}</td>"
                       f"<td>{esc(p['diverged_at'] if p['diverged_at'] is not None else 'none')}</td></tr>"
                       for p in pair.get("prompts", []))
        head = "<tr><th>prompt</th><th>identical tokens</th><th>first divergence</th></tr>"
        parts.append(f"<p><b>{esc(pair['other'])} against {esc(pair['reference'])}</b>: {esc(verdict)}</p>"
                     + (f"<table>{head}{rows}</table>" if rows else ""))
    return "".join(parts)
