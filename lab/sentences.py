"""Sentences from numbers: what the lab says about a result, built from that result alone.

Every sentence here branches on the measured figures it is given (which factor is largest, whether a spread
crosses 1, whether vLLM held more requests than HF's cap) and states no outcome the numbers do not show.
Figures from formulas are called computed, figures from engines measured. The Why tab, ``lab explain`` and
notebook 07 print these same sentences.
"""

from __future__ import annotations

from lab.ladder import largest


def times(value: float) -> str:
    """A factor in words: '3.10x', or '0.80x (a loss)'."""
    return f"{value:.2f}x" + (" (a loss)" if value < 0.995 else "")


def spread_words(f: dict) -> str:
    """'repeats 2.9-3.3x, n=3', or 'one repeat' (no spread to show)."""
    return f"repeats {f['low']:.2f}-{f['high']:.2f}x, n={f['n']}" if f["n"] > 1 else "one repeat: no spread"


def why_caption(fields: dict) -> str:
    """The why ladder's explanation, one sentence a line, from explain.json's fields."""
    total = fields.get("total")
    if not total:
        return "Nothing to compare yet: the hf and vllm rungs have not both finished a turn."
    lines = [f"vLLM made {times(total['value'])} HF's output tok/s ({spread_words(total)}, measured) on this "
             f"load: {fields['preset_words']}."]
    lines += _factor_lines(fields["factors"], fields.get("product"))
    lines += _load_lines(fields)
    lines += [_side_line(s) for s in fields.get("sides", [])]
    lines += [f"Rung {name} did not run: {r['reason']}." for name, r in fields.get("rungs", {}).items()
              if r["status"] != "ran" and r["reason"] and not r["reason"].startswith("not asked")]
    return "\n".join(f"- {line}" for line in lines)


def _factor_lines(factors: list[dict], product: float | None) -> list[str]:
    if not factors:
        return []
    parts = [f"{times(f['value'])} from {f['mechanism']} ({f['lower']} → {f['upper']})" for f in factors]
    lines = ["Step by step: " + "; ".join(parts) + (f" (their product: {product:.2f}x)." if product else ".")]
    big = largest(factors)
    verb = "cost the most" if big["value"] < 1 else "gave the most"
    lines.append(f"Of these steps, {big['mechanism']} ({big['lower']} → {big['upper']}) {verb}: "
                 f"{times(big['value'])}.")
    unsure = [f for f in factors if f["n"] > 1 and f["low"] <= 1 <= f["high"]]
    lines += [f"{f['lower']} → {f['upper']} moved across 1 between repeats ({f['low']:.2f}-{f['high']:.2f}x): "
              f"not a measured gain or loss." for f in unsure]
    return lines


def _load_lines(fields: dict) -> list[str]:
    """What the load could and could not hold, with the per-step times or the memory cap behind it."""
    rungs, lines = fields.get("rungs", {}), []
    if fields.get("load", {}).get("users") == 1:
        steps = {n: r["tpot_ms_median"] for n, r in rungs.items() if r.get("tpot_ms_median")}
        if "hf" in steps and "vllm" in steps:
            lines.append(f"At 1 user every step makes one token, so no batching or paging can act: a step took "
                         f"{steps['hf']:.1f} ms in HF and {steps['vllm']:.1f} ms in vLLM (median time per output "
                         f"token, measured); the ratio here is the cost of a step.")
    budget = fields.get("budget")
    if budget:
        peaks = [p for p in rungs.get("vllm", {}).get("peak_running", []) if p is not None]
        line = (f"HF's batch was capped at {budget['hf_cap']} requests: {budget['tokens']:,} KV tokens over "
                f"{budget['longest_request']} tokens reserved for its longest request (computed)")
        if peaks:
            more = "more than" if max(peaks) > budget["hf_cap"] else "no more than"
            line += f"; vLLM ran up to {max(peaks)} at once in the same tokens (measured), {more} HF's cap"
        lines.append(line + ".")
    return lines


def _side_line(side: dict) -> str:
    """A side rung against its chain rung."""
    value, pair = times(side["value"]), f"({side['upper']} / {side['lower']}, {spread_words(side)})"
    if side["upper"] == "hf-compiled":
        return f"HF's own fix for per-step overhead, a static cache with torch.compile, gave HF {value} {pair}."
    if side["upper"] == "offline":
        return (f"vLLM offline (LLM.generate, every request queued at once, as many running as there are users) "
                f"made {value} the served vLLM's tok/s {pair}: the ceiling, and what the lab's users and streaming "
                f"cost.")
    return f"{side['mechanism'][:1].upper()}{side['mechanism'][1:]}: {value} {pair}."


def ratio_caption(summary: dict, base: str = "hf", top: str = "vllm") -> str:
    """Under the load test's ratio plot: each level's ratio beside the two engines' median time per output token,
    and what a level of that size can and cannot hold (summary.json's ``runs`` and ``ratio``)."""
    ratios = (summary.get("ratios") or {}).get(top) or summary.get("ratio") or {}
    lines = [_level_line(int(users), ratio, summary.get("runs", []), base, top)
             for users, ratio in sorted(ratios.items(), key=lambda kv: int(kv[0])) if ratio]
    if not lines:
        return ""
    return "\n".join(f"- {line}" for line in lines) + (
        "\n\nWhich mechanism makes up the ratio is measured on the **Why** tab.")


def _level_line(users: int, ratio: float, runs: list[dict], base: str, top: str) -> str:
    def step_ms(engine: str) -> float | None:
        found = sorted(r["tpot_s"]["p50"] for r in runs if r["engine"] == engine and r["users"] == users
                       and r.get("tpot_s", {}).get("p50") is not None)
        return found[len(found) // 2] * 1000 if found else None

    low, high = step_ms(base), step_ms(top)
    line = f"At {users} user{'s' if users > 1 else ''}: {top} made {ratio:.2f}x {base}'s output tok/s"
    if low is None or high is None:
        return line + "."
    line += f"; median time per output token {low:.1f} ms in {base}, {high:.1f} ms in {top} (measured)"
    if users == 1:
        return line + ": one request at a time, so nothing is batched or paged; the ratio is the cost of a step."
    return line + "."
