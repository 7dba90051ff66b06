"""A load test's levels in words: each level's ratio beside the engines' time per token, what besides the engines
may have made it (the machine's load, repeats that straddle 1), what moved between two levels or two runs, and what
the load let batching do (summary.json's ``runs`` and the requests; the Load test, reports and notebook 01).
"""

from __future__ import annotations

from lab.engines import registry
from lab.engines.registry import BASELINE, RATIO_TOP
from lab.experiments.ladder import clear
from lab.metrics import ratio_spreads, ratios_by_users
from lab.metrics.machine import STEAL_SHARE, disturbed
from lab.words import MEAN_OF_REPEATS, POOLED, users_words


def ratio_caption(summary: dict, base: str = BASELINE, top: str = RATIO_TOP) -> str:
    """Under the load test's ratio plot: each level's ratio beside the two engines' median time per output token,
    and what a level of that size can and cannot hold (summary.json's ``runs`` and ``ratio``)."""
    ratios = (summary.get("ratios") or {}).get(top) or summary.get("ratio") or {}
    lines = [" ".join(filter(None, [_level_line(int(users), ratio, summary, base, top),
                                    noise_line(summary, int(users), base, top)]))
             for users, ratio in sorted(ratios.items(), key=lambda kv: int(kv[0])) if ratio]
    if not lines:
        return ""
    return "\n".join(f"- {line}" for line in lines) + (
        "\n\nWhich mechanism makes up the ratio is measured on the **Why** tab.")


def _level_line(users: int, ratio: float, summary: dict, base: str, top: str) -> str:
    def step_ms(engine: str) -> float | None:  # the upper median of the repeats' TPOT p50
        found = sorted(per_repeat(summary, engine, users, "tpot_s"))
        return found[len(found) // 2] * 1000 if found else None

    low, high = step_ms(base), step_ms(top)
    base_name, top_name = registry.label(base), registry.label(top)  # the names the page shows (vLLM, HF)
    line = f"At {users} user{'s' if users > 1 else ''}: {top_name} made {ratio:.2f}x {base_name}'s output tok/s"
    if low is None or high is None:
        return line + "."
    line += f"; median time per output token {low:.1f} ms in {base_name}, {high:.1f} ms in {top_name} (measured)"
    if users == 1:
        return line + ": one request at a time, so nothing is batched or paged; the ratio is the cost of a step."
    return line + "."


def noise_line(summary: dict, users: int, base: str = BASELINE, top: str = RATIO_TOP) -> str:
    """What besides the engines may have made a level's ratio (summary.json's ``runs``): other processes or steal
    during its turns (lab.metrics.machine's rule), repeats that straddle 1, and for a ratio below 1 that neither
    explains it; '' for a ratio above 1 that neither touches. Under the Load test's ratio, in reports and notebooks."""
    rows = [r for r in summary.get("runs", []) if r["users"] == users and r["engine"] in (base, top)]
    ratio, spread = ratios_by_users(rows, base, top).get(users), ratio_spreads(rows, base, top).get(users)
    lines = [busy_line(rows, base, top, ratio)] if any(disturbed(r.get("machine")) for r in rows) else []
    if spread and not clear(spread.to_dict()):
        lines.append(f"Its repeats straddle 1 ({spread.low:.2f}-{spread.high:.2f}x, n={spread.n}): no measured gain "
                     "or loss.")
    if not lines and ratio is not None and ratio < 1:
        lines.append(quiet_words(rows, registry.label(top)))
    return " ".join(lines)


def busy_line(rows: list[dict], base: str, top: str, ratio: float | None) -> str:
    """A disturbed level: what the machine did, and that its ratio may be the machine's."""
    which = f"this level's {ratio:.2f}x" if ratio is not None else "this level's figures"
    return f"The machine was shared: {busy_words(rows, base, top)}, so {which} may be the machine, not the engines."


def busy_words(rows: list[dict], base: str, top: str) -> str:
    """'other processes used up to 0.90 of the 2 cores during HF's turns and 0.10 during vLLM's (measured)', and the
    hypervisor's steal where it took STEAL_SHARE or more: the largest of each engine's turns at the level."""
    cores = max(r["machine"]["cores"] for r in rows if r.get("machine"))
    parts = [(registry.label(e), most) for e in (base, top) if (most := _most(rows, e, "others_cores")) is not None]
    said = [f"{value:.2f} of the {cores} cores during {label}'s turns" if i == 0 else f"{value:.2f} during {label}'s"
            for i, (label, value) in enumerate(parts)]
    steal = max((v for e in (base, top) if (v := _most(rows, e, "steal_cores")) is not None), default=0.0)
    stolen = f"; the hypervisor took {steal:.2f} cores (steal)" if steal >= STEAL_SHARE * cores else ""
    return f"other processes used up to {' and '.join(said)}{stolen} (measured)"


def _most(rows: list[dict], engine: str, key: str) -> float | None:
    found = [r["machine"][key] for r in rows if r["engine"] == engine and r.get("machine")]
    return max(found) if found else None


def quiet_words(rows: list[dict], top: str) -> str:
    """Why a ratio below 1 on a quiet machine is the engines' (or that the machine was not sampled)."""
    found = [r["machine"] for r in rows if r.get("machine")]
    if not found:
        return "No machine load was recorded for this level, so the machine is not ruled out as the cause of the loss."
    most = max(m["others_cores"] for m in found)
    return (f"The machine was quiet (other processes used at most {most:.2f} of the {found[0]['cores']} cores, "
            f"measured): {top} lost here.")


def per_repeat(summary: dict, engine: str, users: int, field: str) -> list[float]:
    """One engine's figure at one level, one value per repeat (``field``: output_tok_s, or a latency's p50)."""
    rows = [r for r in summary["runs"] if r["engine"] == engine and r["users"] == users]
    return [r[field] if not isinstance(r[field], dict) else r[field]["p50"] for r in rows
            if r[field] is not None and (not isinstance(r[field], dict) or r[field]["p50"] is not None)]


def moved(before: list[float], after: list[float], unit: str, scale: float = 1.0) -> str:
    """How a measured figure moved: 'rose from 27 to 33 ms/token', or 'stayed at ... (the repeats overlap ...)'."""
    def shown(values):
        return f"{sum(values) / len(values) * scale:,.1f}"

    a, b = f"{shown(before)}", f"{shown(after)}"
    if min(after) <= max(before) and min(before) <= max(after) and (len(before) > 1 or len(after) > 1):
        return f"stayed within its repeats' spread ({a} → {b} {unit})"
    return f"{'rose' if sum(after) / len(after) > sum(before) / len(before) else 'fell'} from {a} to {b} {unit}"


def ratio_note(summary: dict, users: int = 1) -> str:
    """The ratio at ``users`` beside the headline's, and which statistic both are; where the summary has factors,
    that their product pools the repeats instead, so it can differ from these a little."""
    said = (f"At {users_words(users)} the ratio was {float(summary['ratio'][str(users)]):.2f}x (each ratio here: "
            f"{MEAN_OF_REPEATS}, vLLM's over HF's")
    if summary.get("factors"):
        return said + f"; the factors below take {POOLED}, so their product can differ a little)."
    return said + ")."


def levels_answer(summary: dict, rows: list[dict], low: int, high: int, base: str = BASELINE,
                  top: str = RATIO_TOP) -> list:
    """What each engine's tok/s and time per token did from ``low`` to ``high`` users, and what the load let
    batching do (from the requests' own lengths and counts)."""
    lines = []
    for engine in (base, top):
        tok = [per_repeat(summary, engine, u, "output_tok_s") for u in (low, high)]
        tpot = [per_repeat(summary, engine, u, "tpot_s") for u in (low, high)]
        if all(tok) and all(tpot):
            lines.append(f"{engine}: output tok/s {moved(*tok, 'tok/s')}; time per output token "
                         f"{moved(*tpot, 'ms', 1000)} (measured).")
    return lines + load_facts(rows, high, base, top, summary)


def load_facts(rows: list[dict], users: int, base: str, top: str, summary: dict) -> list[str]:
    """What the level's requests let static and continuous batching differ on, measured from the requests."""
    level = [r for r in rows if r["users"] == users and r["engine"] == top and r["status"] == "ok"]
    if not level:
        return []
    outs, prompts = [r["output_tokens"] for r in level], [r["prompt_tokens"] for r in level]
    each = len(level) // max(1, users * max(1, len(per_repeat(summary, top, users, "output_tok_s"))))
    lines = [f"At {users} users the answers ran from {min(outs)} to {max(outs)} tokens and the prompts from "
             f"{min(prompts)} to {max(prompts)} (the requests' own lengths)."]
    if max(outs) > min(outs):
        lines.append("So a static batch kept its finished rows until its longest answer ended, where continuous "
                     "batching gave their places to waiting requests.")
    else:
        lines.append("Every answer had the same length: no row of a static batch finished early.")
    ttft = [per_repeat(summary, e, users, "ttft_s") for e in (base, top)]
    if each > 1 and all(ttft):
        hf, vllm = (sum(v) / len(v) * 1000 for v in ttft)
        of = f"the mean of the {len(ttft[0])} repeats' medians" if len(ttft[0]) > 1 else "the median"
        lines.append(f"Each user sent {each} requests, one after the other: a request that came while {base}'s batch "
                     f"ran waited for it; time to first token {hf:,.0f} ms in {base}, {vllm:,.0f} ms in {top} ({of}, "
                     f"measured).")
    elif each <= 1:
        lines.append("Each user sent one request, so no request arrived while a batch ran: continuous batching had "
                     "nothing to admit mid-batch.")
    return lines


def runs_answer(first: dict, second: dict, users: int, names: tuple[str, str]) -> list[str]:
    """Two runs' ratios at one level, and whether the change is beyond the repeats' spread."""
    a, b = (float(s["ratio"][str(users)]) for s in (first, second))
    spreads = [s.get("spread", {}).get("ratio", {}).get(str(users)) for s in (first, second)]
    overlap = all(spreads) and spreads[0]["low"] <= spreads[1]["high"] and spreads[1]["low"] <= spreads[0]["high"]
    verb = "grew" if b > a else "shrank"
    line = f"The ratio at {users} users {verb} from {a:.2f}x with `{names[0]}` to {b:.2f}x with `{names[1]}`"
    return [line + (": within the repeats' spread, not a measured change." if overlap and all(
        s["n"] > 1 for s in spreads) else ".")]


def padding_words(rows: list[dict], users: int, name: str, engine: str = BASELINE) -> str:
    """The share of prompt tokens a static batch of all the level's requests would pad (computed)."""
    level = [r["prompt_tokens"] for r in rows if r["users"] == users and r["engine"] == engine]
    if not level:
        return ""
    pad = 1 - sum(level) / (len(level) * max(level))
    return (f"With `{name}`, padding every prompt of the {users}-user level to its longest ({max(level)} tokens) "
            f"would make {pad:.0%} of a batch's prompt tokens padding (computed from the requests' lengths).")
