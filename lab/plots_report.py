"""A run as one self-contained HTML page to hand out: its figures, tables, sentences, agreement, engine args,
device and spread, from its summary.json and requests.csv alone.

Plotly's JavaScript is written into the page once (``include_plotlyjs=True``, no CDN), so the file opens in a
browser with no network. The figures are the dashboard's own (lab.plots), drawn from the stored summary; the
figures over time need the engines' samples, which a stored run does not keep, and are left out.
"""

from __future__ import annotations

import html
import json

import pandas as pd
import plotly.graph_objects as go

from lab.plots import _layout, latency_table, ratio_bars, tok_s_bars, turn_ttft_figure
from lab.sentences import chat_answer, ratio_caption

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#2a3f5f}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #dde;padding:3px 7px}"
         "pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px}.fig{margin:1em 0}")


def report_html(summary: dict, requests: pd.DataFrame) -> str:
    """The whole page for one run."""
    figures = [tok_s_bars(summary), ratio_bars(summary), lengths_figure(requests)]
    if summary.get("turns"):
        figures.append(turn_ttft_figure(summary))
    parts = [f"<h1>KV Lab run {esc(summary['run_id'])}</h1>", facts(summary), sentences(summary)]
    parts += [figure_div(fig, index == 0) for index, fig in enumerate(figures)]
    parts += [section("Latency (ms) per engine and user level", latency_table(summary).to_html(index=False)),
              section("Spread over repeats", json_block(summary.get("spread"))),
              section("Do the engines compute the same thing?", agreement_html(summary.get("agreement") or [])),
              section("Engine args", json_block(summary.get("engine_args"))),
              section("Device and versions", json_block({"device": summary.get("device"),
                                                          "versions": summary.get("versions")}))]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>KV Lab run {esc(summary['run_id'])}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


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
    rows = {"status": summary["status"] + (f" ({summary['error']})" if summary.get("error") else ""),
            "started": summary.get("started_at"), "model": summary.get("model"),
            "device": (summary.get("device") or {}).get("name"), "engines": ", ".join(summary["engines"]),
            "workload": summary["workload"], "users": ", ".join(map(str, summary["users"])),
            "requests per user": load.get("requests_per_user"), "seconds per level": load.get("duration_s"),
            "output length": load.get("output_len") or "the workload's", "repeats": load.get("repeats"),
            "seed": load.get("seed")}
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows.items() if v is not None)
    return f"<table>{cells}</table>"


def sentences(summary: dict) -> str:
    """The lab's computed sentences about this run (the ratio caption, a chat run's turns)."""
    said = [ratio_caption(summary), *chat_answer(summary)]
    return "".join(f"<p>{esc(line.replace('**', ''))}</p>" for line in said if line)  # the page's bold marks


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
