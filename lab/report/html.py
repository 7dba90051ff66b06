"""The HTML a report is made of, without plotly: values rounded for a reader, tables, and computed prose as
paragraphs and real lists (lab.plots.report puts them together, one page per kind of result).

Every value a report prints passes through ``cell``: floats to 3 significant figures (whole numbers from 100 up),
bytes in KiB/MiB/GiB, yes/no, and "—" for a value that is missing or not a number, so no page shows raw JSON,
16-digit floats or NaN. A table or section with nothing to hold is left out (``""``), never drawn empty.
"""

from __future__ import annotations

import html
import math
import numbers
import re

MISSING = "—"  # a value the result does not hold; the table's note says why
NOT_SET = "not set"  # a setting left to its default
STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#2a3f5f;"
         "line-height:1.45}h1{font-size:1.6em}h2{font-size:1.25em;margin:1.6em 0 .4em}"
         "h3{font-size:1.05em;margin:1em 0 .3em}"
         "table{border-collapse:collapse;font-size:13px;margin:.4em 0}td,th{border:1px solid #dde;padding:3px 7px;"
         "text-align:left;vertical-align:top}th{background:#f6f8fa}td.num{text-align:right;"
         "font-variant-numeric:tabular-nums}.scroll{overflow-x:auto}.pair{display:flex;gap:2em;flex-wrap:wrap}"
         "ul{margin:.4em 0;padding-left:1.4em}li{margin:.2em 0}.note{color:#5a6b85;font-size:13px}"
         ".fig{margin:1em 0}code{background:#f6f8fa;padding:0 3px;font-size:12px}")


def esc(value) -> str:
    return html.escape(str(value))


def section(title: str, body: str, level: int = 2) -> str:
    """A heading over ``body``; nothing at all when the body is empty."""
    return f"<h{level}>{esc(title)}</h{level}>{body}" if body else ""


def cell(value, key: str = "", none: str = MISSING) -> str:
    """One value as text: rounded, bytes in binary units (a key ending in _bytes), yes/no, ``none`` for None or
    NaN; a nested dict or list inline ('a: 1; b: 2', '1, 2')."""
    if value is None or (is_number(value) and not math.isfinite(value)):
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if is_number(value) and key.endswith("_bytes"):
        return size(value)
    if isinstance(value, numbers.Integral):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, numbers.Real):
        return decimal(float(value))
    if isinstance(value, dict):
        return "; ".join(f"{k}: {cell(v, str(k), none)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return none if value and all(v is None for v in value) else ", ".join(cell(v, key, none) for v in value) \
            or "none"
    return str(value)


def decimal(value: float) -> str:
    """3 significant figures, whole from 100 up: 0.00312, 0.515, 17.1, 3,975 (never 3.98e+03)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def size(n: float) -> str:
    """Bytes in the largest binary unit under them: '256 MiB', '23.5 GiB', '512 bytes'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{decimal(n / scale)} {unit}"
    return f"{n:,.0f} bytes"


def when(stamp: str | None) -> str | None:
    """An ISO time as '2026-11-27 21:15:50 UTC' (to the second)."""
    if not stamp:
        return None
    return stamp[:19].replace("T", " ") + (" UTC" if stamp.endswith(("+00:00", "Z")) else "")


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Code(str):
    """Text shown as code (a command-line flag), as it is."""


def table(rows: list[dict], columns: list[str] | None = None, none: str = MISSING, note: str = "") -> str:
    """Rows of dicts as a table (numbers right-aligned, each value through ``cell``; a key a row lacks, an empty
    cell), with a note under it; nothing for no rows."""
    if not rows:
        return ""
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(table_cell(row[c], c, none) if c in row else "<td></td>" for c in columns)
                   + "</tr>" for row in rows)
    return (f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
            + (f"<p class='note'>{esc(note)}</p>" if note else ""))


def table_cell(value, key: str, none: str) -> str:
    if isinstance(value, Code):
        return f"<td><code>{esc(value)}</code></td>"
    align = " class='num'" if is_number(value) else ""
    return f"<td{align}>{esc(cell(value, key, none))}</td>"


def pairs_table(rows: dict, none: str | None = None) -> str:
    """Name and value rows, each name a row heading; a value of None is left out, or shown as ``none`` where given;
    nothing for no rows."""
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(cell(v, str(k), none or MISSING))}</td></tr>"
                    for k, v in rows.items() if v is not None or none)
    return f"<table>{cells}</table>" if cells else ""


def fields_table(value: dict, none: str = MISSING) -> str:
    """A nested dict as name and value rows, nested names joined ('hf · waste_pct · peak')."""
    return pairs_table(dict(flat_rows(value)), none) if value else ""


def flat_rows(value, key: str = "") -> list[tuple[str, object]]:
    """A nested dict (or list of dicts) as (joined name, value) pairs; a list of plain values stays one value."""
    if isinstance(value, dict) and value:
        return [row for k, v in value.items() for row in flat_rows(v, f"{key} · {k}" if key else str(k))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [row for i, v in enumerate(value, 1) for row in flat_rows(v, f"{key} {i}")]
    return [(key, value if value != {} else "none")]


def columns_table(by_name: dict[str, dict], corner: str = "", none: str = MISSING, skip: tuple = ()) -> str:
    """Several dicts side by side (one column each, e.g. each engine's args): a row per key any of them has (an
    empty cell where one lacks it)."""
    named = {name: values for name, values in by_name.items() if isinstance(values, dict) and values}
    keys = [k for k in dict.fromkeys(k for values in named.values() for k in values) if k not in skip]
    rows = [{corner: k} | {name: cell(values[k], str(k), none) for name, values in named.items() if k in values}
            for k in keys]
    return table(rows, [corner, *named], none)


def prose(lines: list[str]) -> str:
    """Computed sentences as HTML: a line of its own is a paragraph, runs of '- ' lines a list, '**x**' bold."""
    return "".join(block_html(block) for line in lines if line for block in re.split(r"\n\s*\n", line))


def block_html(block: str) -> str:
    """One block of text: its '- ' lines as one list, the other lines as paragraphs, in order."""
    parts, items = [], []
    for line in (text.strip() for text in block.splitlines()):
        if line.startswith("- "):
            items.append(line[2:])
            continue
        parts.append(bullets(items))
        items = []
        parts.append(f"<p>{inline(line)}</p>" if line else "")
    return "".join(parts) + bullets(items)


def bullets(items: list[str]) -> str:
    """Sentences as a bulleted list; nothing for none."""
    return "<ul>" + "".join(f"<li>{inline(item)}</li>" for item in items) + "</ul>" if items else ""


def inline(text: str) -> str:
    """One sentence escaped, its '**bold**' marks as bold."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", esc(text))


def page(title: str, parts: list[str]) -> str:
    """One HTML document: the title as its heading, then ``parts`` (empty ones drop out)."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{esc(title)}</h1>{''.join(parts)}</body></html>")
