"""The why ladder in words: what each rung's step gave, what the load could hold, and how the lead moves with
users (lab.experiments.why's explain.json fields; the Why tab, ``lab explain`` and notebook 07 print these).
"""

from __future__ import annotations

from lab.engines import registry
from lab.engines.registry import BASELINE, BATCHING, RATIO_TOP
from lab.experiments.ladder import RUNGS, clear, largest_clear
from lab.metrics.steps import FACTORS
from lab.metrics.steps_words import FACTOR_NAMES, larger
from lab.words import PAIRED, factor_words, spread_words, times, users_words


def why_caption(fields: dict) -> str:
    """The why ladder's explanation, one sentence a line, from explain.json's fields."""
    total = fields.get("total")
    if not total:
        return "Nothing to compare yet: the hf and vllm rungs have not both finished a turn."
    lines = [f"vLLM made {times(total['value'])} HF's output tok/s ({PAIRED}; {spread_words(total)}, measured) on this "
             f"load: {fields['preset_words']}."]
    lines += _factor_lines(fields["factors"], fields.get("product"), fields.get("load", {}).get("users"))
    lines += _load_lines(fields)
    lines += [_side_line(s) for s in fields.get("sides", [])]
    lines += [f"Rung {name} did not run: {r['reason']}." for name, r in fields.get("rungs", {}).items()
              if r["status"] != "ran" and r["reason"] and not r["reason"].startswith("not asked")]
    return "\n".join(f"- {line}" for line in lines)


def _factor_lines(factors: list[dict], product: float | None, users: int | None) -> list[str]:
    if not factors:
        return []
    parts = [f"{factor_words(f)} from {_mechanism(f, users)} ({f['lower']} → {f['upper']})" for f in factors]
    lines = ["Step by step: " + "; ".join(parts) + (f" (their product: {product:.2f}x)." if product else ".")]
    big = largest_clear(factors)
    if big is None:
        return lines + ["No step stands out: every step's repeats straddle 1."]
    verb = "cost the most" if big["value"] < 1 else "gave the most"
    return lines + [f"Of these steps, {_mechanism(big, users)} ({big['lower']} → {big['upper']}) {verb}: "
                    f"{factor_words(big)}."]


def largest_words(factors: list[dict]) -> str:
    """A ladder's headline: its largest step clear of its repeats' spread, or that none is."""
    big = largest_clear(factors)
    if big is None:
        return "no step stands out: every step's repeats straddle 1"
    return f"the largest step is **{big['lower']} → {big['upper']}**, {factor_words(big)} ({big['mechanism']})"


def _mechanism(f: dict, users: int | None) -> str:
    """A step's mechanism; at one user batching is named for what it can hold there (one request a step)."""
    batching = RUNGS[BATCHING].mechanism
    if users != 1 or batching not in f["mechanism"]:
        return f["mechanism"]
    rest = f["mechanism"].replace(f"{batching} + ", "")
    if rest == batching:
        return "the two HF loops' cost per step (at 1 user nothing is batched)"
    return f"{rest} (at 1 user nothing is batched)"


def _load_lines(fields: dict) -> list[str]:
    """What the load could and could not hold, with the per-step times or the memory cap behind it."""
    rungs, lines = fields.get("rungs", {}), []
    if fields.get("load", {}).get("users") == 1:
        lines += _step_lines(rungs, fields.get("total"))
    budget = fields.get("budget")
    if budget:
        line = (f"HF's batch was capped at {budget['hf_cap']} requests: {budget['tokens']:,} KV tokens over "
                f"{budget['longest_request']} tokens reserved for its longest request (computed)")
        for name, label in ((n, registry.label(n)) for n in (RATIO_TOP, BATCHING)):
            peaks = [p for p in rungs.get(name, {}).get("peak_running", []) if p is not None]
            if peaks:
                more = "more than" if max(peaks) > budget["hf_cap"] else "no more than"
                line += f"; {label} ran up to {max(peaks)} at once in the same tokens (measured), {more} HF's cap"
        lines.append(line + ".")
    return lines


def _step_lines(rungs: dict, total: dict | None) -> list[str]:
    """At one user: each engine's time per output token, and how much of the ratio it accounts for."""
    hf, vllm = (rungs.get(n, {}).get("tpot_ms_median") for n in (BASELINE, RATIO_TOP))
    if not hf or not vllm or not total:
        return []
    steps = hf / vllm
    line = (f"At 1 user each step makes one token: a step took {hf:.1f} ms in HF and {vllm:.1f} ms in vLLM (median "
            f"time per output token, measured), {steps:.2f}x")
    if abs(steps / total["value"] - 1) <= 0.15:
        return [line + f", close to the {total['value']:.2f}x ratio: here the ratio is mostly the cost of a step."]
    return [line + f" against the {total['value']:.2f}x ratio: the rest is each request's first token (its prefill) "
                   f"and the gaps between requests."]


def _side_line(side: dict) -> str:
    """A side rung against its chain rung."""
    value, pair = factor_words(side), f"({side['upper']} / {side['lower']}, {spread_words(side)})"
    if side["upper"] == "hf-compiled":
        return f"HF's own fix for per-step overhead, a static cache with torch.compile, gave HF {value} {pair}."
    if side["upper"] == "offline":
        said = f"vLLM offline (LLM.generate, as many requests running as there are users) made {value} the served " \
               f"vLLM's tok/s {pair}"
        if not clear(side):
            return said + ": the lab's users and streaming cost nothing measurable here."
        if side["value"] > 1:
            return said + ": offline bounds the served vLLM here; the gap is what the lab's users and streaming cost."
        return said + ": served vLLM beat offline here."
    return f"{side['mechanism'][:1].upper()}{side['mechanism'][1:]}: {value} {pair}."


def ladder_levels_lines(levels: dict) -> list[str]:
    """What moved between a ladder's user levels: the total, the step that gave the most at each level (never one
    whose repeats straddle 1) and the lead taken apart by steps; empty for a ladder of one level."""
    done = sorted(((int(u), lv) for u, lv in levels.items() if lv.get("total")), key=lambda kv: kv[0])
    if len(done) < 2:
        return []
    totals = ", ".join(f"{factor_words(lv['total'])} at {users_words(u)}" for u, lv in done)
    lines = [f"Across users (measured), vLLM / HF output tok/s: {totals}."]
    steps = "; ".join(f"at {users_words(u)}, {_biggest_step(lv)}" for u, lv in done)
    lines.append(f"The step that gave the most: {steps}.")
    parts = [f"at {users_words(u)} {_steps_words(lv['steps'])}" for u, lv in done if lv.get("steps")]
    if parts:
        lines.append("HF → vLLM taken apart by steps (measured): " + "; ".join(parts) + ".")
    return lines


def _biggest_step(level: dict) -> str:
    big = largest_clear(level.get("factors", []))
    if big is None:
        return "none stands out (every step's repeats straddle 1)"
    return f"{big['lower']} → {big['upper']} ({big['mechanism']}), {factor_words(big)}"


def _steps_words(level: dict) -> str:
    found = ", ".join(f"{FACTOR_NAMES[f]} {level['factors'][f]['value']:.2f}x" for f in FACTORS)
    big = larger(level)
    return found + (f" (most: {FACTOR_NAMES[big['name']]})" if big else " (no factor clear of its repeats' spread)")
