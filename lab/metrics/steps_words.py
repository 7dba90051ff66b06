"""What a level's ratio is made of, in words and a small table, from summary.json's ``factors`` alone.

lab.metrics.steps takes each level's ratio apart into tokens per step x time per step x busy fraction and sets
each engine's step against the hardware's floor; this module says which factor made the ratio (never one whose
repeats straddle 1), what made it (useful rows a step, the cost of a step) and whether a step is near the floor
or far above it. The Load test, reports and notebooks print these; the factors are measured, the floor computed.
"""

from __future__ import annotations

from lab.engines import registry
from lab.experiments.ladder import clear, largest_clear
from lab.metrics.levels_words import busy_words
from lab.metrics.machine import disturbed
from lab.metrics.steps import FACTORS, NEAR_FLOOR
from lab.words import POOLED, by_users, factor_words, users_words

FACTOR_NAMES = {"tokens_per_step": "output tokens per step", "s_per_step": "less time per step",
                "busy_fraction": "busy fraction"}


def larger(level: dict) -> dict | None:
    """The factor farthest from 1 among the clear ones, or None when every factor straddles 1."""
    return largest_clear(list(level["factors"].values()))


def level_lines(users: int, level: dict) -> list[str]:
    """A level's identity, its larger factor and what made it, and the floor line."""
    base, top = (registry.label(level[k]) for k in ("base", "top"))
    parts = [f"{factor_words(level['factors'][f])} {FACTOR_NAMES[f]}" for f in FACTORS]
    lines = [f"At {users_words(users)}, {top}/{base} {level['product']:.2f}x = " + " x ".join(parts)
             + f" (measured, {POOLED}; {_rows_words(level, base, top)}; a step took {_ms(level, level['base'])} in "
               f"{base}, {_ms(level, level['top'])} in {top})."]
    return lines + [_larger_line(level, base, top)] + _row_lines(level, base, top) + _floor_lines(level, base, top)


def _row_lines(level: dict, base: str, top: str) -> list[str]:
    """Where time per step made the ratio and the two steps ran different numbers of rows (a static batch computes
    its finished rows and padding too): the step's time split into rows a step x time per row."""
    big, (b, t) = larger(level), (level["engines"][level[k]] for k in ("base", "top"))
    if not big or big["name"] != "s_per_step" or not b.get("rows") or not t.get("rows"):
        return []
    if abs(b["rows"] / t["rows"] - 1) < 0.1:
        return []
    per_row = [e["s_per_step"] / e["rows"] * 1000 for e in (b, t)]
    return [f"Split further: {base}'s step ran {b['rows']:.1f} rows against {top}'s {t['rows']:.1f} "
            f"({b['rows'] / t['rows']:.2f}x), and a row's share of a step took {per_row[0]:.1f} ms in {base}, "
            f"{per_row[1]:.1f} ms in {top} ({per_row[0] / per_row[1]:.2f}x) (measured)."]


def _ms(level: dict, engine: str) -> str:
    return f"{level['engines'][engine]['s_per_step'] * 1000:.1f} ms"


def _rows_words(level: dict, base: str, top: str) -> str:
    return "; ".join(_engine_rows(level["engines"][name], label)
                     for name, label in ((level["base"], base), (level["top"], top)))


def _engine_rows(engine: dict, label: str) -> str:
    """'HF's batch ran 2.6 useful rows of 4.0 a step' where it ran idle rows, else '{label} ran 2.5 tokens a step'."""
    rows, tokens = engine.get("rows"), engine["tokens_per_step"]
    if rows and rows - tokens > 0.05 * rows:
        return f"{label}'s batch ran {tokens:.1f} useful rows of {rows:.1f} a step (finished rows and padding ran too)"
    return f"{label} made {tokens:.1f} tokens a step"


def _larger_line(level: dict, base: str, top: str) -> str:
    big = larger(level)
    if big is None:
        return "No factor stands out: every factor's repeats straddle 1."
    verb = "lost the most" if big["value"] < 1 else "gave the most"
    return f"Of the three, {FACTOR_NAMES[big['name']]} {verb} ({factor_words(big)}): {_cause(big['name'], level)}."


def _cause(name: str, level: dict) -> str:
    base, top = (registry.label(level[k]) for k in ("base", "top"))
    if name == "tokens_per_step":
        engine = level["engines"][level["base"]]
        idle = engine.get("rows") and engine["rows"] - engine["tokens_per_step"] > 0.05 * engine["rows"]
        why = (f"{base}'s static batch ran finished rows and padding" if idle else
               f"{top} held more requests at once than {base} ran")
        return f"batching and KV memory, how many requests make a token in each step ({why})"
    if name == "s_per_step":
        return f"what one step costs: kernels, framework overhead and the batch's size ({top}'s step against {base}'s)"
    return "time with work waiting and no step running (a batch being gathered, a client's pace)"


def _floor_lines(level: dict, base: str, top: str) -> list[str]:
    floors = [(label, level["engines"][level[k]].get("floor")) for k, label in (("base", base), ("top", top))]
    if any(f is None for _, f in floors):
        return []
    each = " and ".join(f"{_ms_words(f['floor_s'])} for {label}'s ({f['bytes'] / 1e6:,.0f} MB)" for label, f in floors)
    took = " and ".join(f"{label}'s step {f['multiple']:.1f}x its floor" for label, f in floors)
    return [f"Against the hardware (computed): reading the weights and the running contexts' KV once a step takes "
            f"{each} at the measured copy bandwidth of {floors[0][1]['bandwidth'] / 1e9:,.1f} GB/s; {took}: "
            f"{_bound(level, base, top)}."]


def _ms_words(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.2f} ms" if ms < 1 else f"{ms:.1f} ms"


def _bound(level: dict, base: str, top: str) -> str:
    near = {name: e["floor"]["multiple"] <= NEAR_FLOOR for name, e in level["engines"].items()}
    if all(near.values()):
        return "both near the floor, bound by memory bandwidth"
    if not any(near.values()):
        return "both far above their floors, bound by compute and overhead, not by reading memory"
    bound, free = (top, base) if near[level["top"]] else (base, top)
    return f"{bound} near the floor (bandwidth-bound), {free} far above it (compute and overhead)"


def factors_rows(factors: dict) -> list[list[str]]:
    """The factors as table rows, the header first: per level the ratio and its three factors (measured) and each
    engine's step as a multiple of its floor (computed); empty when no level has factors."""
    if not factors:
        return []
    first = next(iter(factors.values()))
    base, top = (registry.label(first[k]) for k in ("base", "top"))
    head = ["users", f"{top}/{base}", "= tokens per step", "x time per step", "x busy", f"{base} step / floor",
            f"{top} step / floor"]
    return [head] + [_table_row(users, level) for users, level in by_users(factors)]


def factors_table(factors: dict) -> str:
    """factors_rows as a markdown table."""
    rows = factors_rows(factors)
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines[:1] + ["|" + "---|" * len(rows[0])] + lines[1:]) if rows else ""


def _table_row(users: str, level: dict) -> list[str]:
    cells = [users, f"{level['product']:.2f}x"] + [_cell(level["factors"][f]) for f in FACTORS]
    return cells + [_floor_cell(level["engines"][level[k]]) for k in ("base", "top")]


def _cell(factor: dict) -> str:
    text = f"{factor['value']:.2f}x"
    return text + (f" ({factor['low']:.2f}-{factor['high']:.2f})" if factor["n"] > 1 else "") + \
        ("" if clear(factor) else " ~1")


def _floor_cell(engine: dict) -> str:
    floor = engine.get("floor")
    return f"{floor['multiple']:.1f}x" if floor else "–"


def factors_lines(summary: dict) -> list[str]:
    """Every level's lines, in level order."""
    factors = summary.get("factors") or {}
    return [line for users, level in by_users(factors)
            for line in level_lines(int(users), level) + shared_lines(summary, int(users), level)]


def shared_lines(summary: dict, users: int, level: dict) -> list[str]:
    """Where other processes or steal disturbed the level (lab.metrics.machine's rule): the figure, and that its
    factors may be the machine's."""
    rows = [r for r in summary.get("runs", []) if r["users"] == users and r["engine"] in (level["base"], level["top"])]
    if not any(disturbed(r.get("machine")) for r in rows):
        return []
    return [f"The machine was shared during this level: {busy_words(rows, level['base'], level['top'])}, so its "
            "factors may be the machine's, not the engines'."]


FACTORS_TITLE = ("Why the ratio, level by level (factors measured, floors computed; a level's repeats pooled: all "
                 "tokens over all seconds)")


def factors_caption(summary: dict) -> str:
    """Under the Load test's ratio: the table, then each level's lines."""
    lines = factors_lines(summary)
    if not lines:
        return ""
    return (f"**{FACTORS_TITLE}**:\n\n" + factors_table(summary["factors"]) + "\n\n"
            + "\n".join(f"- {line}" for line in lines))
