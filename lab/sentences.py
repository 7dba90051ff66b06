"""Sentences from numbers: what the lab says about a result, built from that result alone.

Every sentence here branches on the measured figures it is given (which factor is largest, whether a spread
crosses 1, whether vLLM held more requests than HF's cap) and states no outcome the numbers do not show.
Figures from formulas are called computed, figures from engines measured. The Why tab, ``lab explain`` and
notebook 07 print these same sentences.
"""

from __future__ import annotations

from lab.engines import registry
from lab.labels import kind, kv_origin
from lab.ladder import RUNGS, clear, largest_clear
from lab.metrics import ratio_spreads, ratios_by_users
from lab.metrics.machine import STEAL_SHARE, disturbed


def times(value: float) -> str:
    """A factor in words: '3.10x', or '0.80x (a loss)'."""
    return f"{value:.2f}x" + (" (a loss)" if value < 0.995 else "")


def factor_words(f: dict) -> str:
    """A measured factor in words: a loss only when every repeat lost, 'within noise' when the repeats straddle 1."""
    if not clear(f):
        return f"{f['value']:.2f}x (its repeats straddle 1: no measured gain or loss)"
    return times(f["value"]) if f["n"] == 1 or f["high"] < 1 or f["value"] >= 0.995 else f"{f['value']:.2f}x"


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
    batching = RUNGS["hf-cb"].mechanism
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
        for name, label in (("vllm", "vLLM"), ("hf-cb", "HF-CB")):
            peaks = [p for p in rungs.get(name, {}).get("peak_running", []) if p is not None]
            if peaks:
                more = "more than" if max(peaks) > budget["hf_cap"] else "no more than"
                line += f"; {label} ran up to {max(peaks)} at once in the same tokens (measured), {more} HF's cap"
        lines.append(line + ".")
    return lines


def _step_lines(rungs: dict, total: dict | None) -> list[str]:
    """At one user: each engine's time per output token, and how much of the ratio it accounts for."""
    hf, vllm = (rungs.get(n, {}).get("tpot_ms_median") for n in ("hf", "vllm"))
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


def ratio_caption(summary: dict, base: str = "hf", top: str = "vllm") -> str:
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


def noise_line(summary: dict, users: int, base: str = "hf", top: str = "vllm") -> str:
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


# -- load tests in the notebooks: what moved between two levels or two runs, and what the load could hold ----------
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


def levels_answer(summary: dict, rows: list[dict], low: int, high: int, base: str = "hf", top: str = "vllm") -> list:
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


def padding_words(rows: list[dict], users: int, name: str, engine: str = "hf") -> str:
    """The share of prompt tokens a static batch of all the level's requests would pad (computed)."""
    level = [r["prompt_tokens"] for r in rows if r["users"] == users and r["engine"] == engine]
    if not level:
        return ""
    pad = 1 - sum(level) / (len(level) * max(level))
    return (f"With `{name}`, padding every prompt of the {users}-user level to its longest ({max(level)} tokens) "
            f"would make {pad:.0%} of a batch's prompt tokens padding (computed from the requests' lengths).")


# -- the KV-cache notebook (02): why a cache, what it costs, who wasted more --------------------------------------
def cache_answer(fields: dict) -> list[str]:
    """How time per token grew with length each way (measured), then the cache's bytes: GQA and the pool."""
    return cache_time_lines(fields) + memory_lines(fields)


def cache_time_lines(fields: dict) -> list[str]:
    """How time per token grew with length with the cache and without it (measured): the cache's answer before its
    bytes are asked for."""
    from lab.experiments.cache import growth

    series = fields["ms_per_token"]
    (short, a), (long, b) = series["with cache"][0], series["with cache"][-1]
    c, d = series["without cache"][0][1], series["without cache"][-1][1]
    lines = [f"With the cache a token took {a:.1f} ms at {short} tokens and {b:.1f} ms at {long}; without it, "
             f"{c:.1f} ms and {d:.1f} ms (measured)."]
    without, with_ = growth(fields, "without cache"), growth(fields, "with cache")
    if without > with_ * 1.1:
        lines.append(f"Without the cache each step recomputes the keys and values of the whole sequence so far, so its "
                     f"cost grew {without:.1f}x over these lengths against {with_:.1f}x with the cache.")
    else:
        lines.append(f"At these lengths recomputing the past did not show ({without:.1f}x growth without the cache, "
                     f"{with_:.1f}x with it): a step's fixed cost hides it; try longer lengths.")
    return lines


def memory_lines(fields: dict) -> list[str]:
    """Bytes per token with grouped-query attention spelled out, and the pool computed beside vLLM's own count."""
    heads, kv = fields["query_heads"], fields["kv_heads"]
    lines = [f"Each token's keys and values take {fields['formula']} (computed from the model's config)."]
    if kv < heads:
        lines.append(f"Grouped-query attention: {heads} query heads share {kv} key/value heads, so the cache holds "
                     f"{kv}/{heads} of what one key/value head per query head would (computed).")
    ours, theirs = fields.get("pool_tokens_computed"), fields.get("pool_tokens_vllm")
    if ours and theirs:
        agree = "agrees with" if abs(ours - theirs) <= fields["block_size"] else "differs from"
        lines.append(f"vLLM's pool: {fields['pool_bytes']:,} bytes / {fields['bytes_per_token']:,} = {ours:,} tokens "
                     f"(computed), which {agree} vLLM's own count, {theirs:,} tokens in blocks of "
                     f"{fields['block_size']} (measured).")
    return lines


def waste_answer(fields: dict) -> list[str]:
    """Which engine wasted more KV (time-weighted, measured), and the reason the run's own shapes give."""
    hf, vllm = fields["hf"]["waste_pct"]["mean"], fields["vllm"]["waste_pct"]["mean"]
    block = fields["vllm"]["block_size"]
    more = "HF" if hf > vllm else "vLLM"
    lines = [f"{more} wasted more here: HF {hf} % of the KV it held ({_kv_words('hf')}), vLLM {vllm} % "
             f"({_kv_words('vllm')}; time-weighted means)."]
    if vllm >= hf:
        lines.append(f"vLLM's waste is the empty tail of each request's last block: with blocks of {block} tokens a "
                     f"short request leaves most of its one block empty. HF's ({hf} %) is padding and finished rows, "
                     f"and this load gave it less of both.")
    else:
        lines.append(f"HF's waste is padding (prompts padded to the batch's longest) and rows whose answer ended while "
                     f"the batch ran on; vLLM's is only the empty tail of each request's last block of {block}.")
    return lines


def waste_change(first: dict, second: dict, names: tuple[str, str]) -> str:
    """Two waste runs on different loads: whose time-weighted waste moved more (measured), in points."""
    moves = {e: second[e]["waste_pct"]["mean"] - first[e]["waste_pct"]["mean"] for e in ("hf", "vllm")
             if (first.get(e) or {}).get("waste_pct", {}).get("mean") is not None
             and (second.get(e) or {}).get("waste_pct", {}).get("mean") is not None}
    if len(moves) < 2:
        return "One of the runs measured no waste for an engine: nothing to compare."
    said = "; ".join(f"{ENGINE_LABELS[e]}'s {_points(v)}" for e, v in moves.items())
    more = max(moves, key=lambda e: abs(moves[e]))
    return (f"From `{names[0]}` to `{names[1]}` {said} (time-weighted waste; HF's {_kv_words('hf')}, vLLM's "
            f"{_kv_words('vllm')}): {ENGINE_LABELS[more]}'s waste changed more.")


def _kv_words(engine: str) -> str:
    """How an engine's KV figures were had: 'measured' (vLLM's used blocks) or 'computed from its batch's shape'."""
    return kind(kv_origin(engine)) + ("" if kv_origin(engine) == "engine" else " from its batch's shape")


def _points(change: float) -> str:
    return "did not move" if abs(change) < 0.05 else f"{'rose' if change > 0 else 'fell'} {abs(change):.1f} points"


KIND_NAMES = {"reservation": "reservation", "internal": "internal fragmentation",
              "external": "external fragmentation"}
ENGINE_LABELS = {"hf": "HF", "hf-static": "HF with a static cache", "vllm": "vLLM"}


def kinds_answer(fields: dict) -> list[str]:
    """The three kinds of waste side by side (measured), the engine that kept the most of its KV holding tokens,
    each engine's largest kind and why, then the vLLM paper's published shares beside this run's."""
    engines = [e for e in ("hf-static", "hf", "vllm") if (fields.get(e) or {}).get("kinds_pct", {}).get("real")
               is not None]
    if not engines:
        return ["No engine held KV long enough to split its memory by kind."]
    lines = [_kinds_line(e, fields[e]["kinds_pct"]) for e in engines]
    best = max(engines, key=lambda e: fields[e]["kinds_pct"]["real"])
    lines.append(f"{ENGINE_LABELS[best]} kept the largest share of its KV holding tokens here.")
    lines += [_largest_kind(e, fields) for e in engines]
    return [line for line in lines if line] + _paper_lines(fields)


def _kinds_line(engine: str, kinds: dict) -> str:
    held = f"{ENGINE_LABELS[engine]}: {kinds['real']} % of the KV it held held tokens; "
    if engine == "vllm":  # its blocks are counted only while a request holds tokens in them: two kinds are 0 by design
        return held + (f"internal fragmentation {kinds['internal']} % (memory x time, measured); reservation and "
                       "external fragmentation 0 by design, not measured apart (a block is taken when a token needs "
                       "it, and any free block serves any request).")
    return held + (f"reservation {kinds['reservation']} %, internal fragmentation {kinds['internal']} %, external "
                   f"fragmentation {kinds['external']} % (memory x time, {_kv_words(engine)}).")


def _largest_kind(engine: str, fields: dict) -> str:
    """Why an engine's largest kind of waste was what it was, from the run's own shapes."""
    kinds = fields[engine]["kinds_pct"]
    kind = max(KIND_NAMES, key=lambda k: kinds[k])
    if not kinds[kind]:
        return f"{ENGINE_LABELS[engine]} wasted nothing measurable here."
    head = f"{ENGINE_LABELS[engine]}'s largest waste was {KIND_NAMES[kind]} ({kinds[kind]} %): "
    if engine == "vllm":
        return head + _tail_words(fields)
    if kind == "reservation":
        return head + (f"every row was reserved for the load's longest request "
                       f"({fields[engine]['cache_tokens_per_row']} tokens) before its first token, so each running "
                       f"request's tokens to come sat in slots held for them.")
    if kind == "external":
        return head + "batches gathered fewer requests than the cache has rows; the rows left over held no request."
    if engine == "hf-static":
        return head + (f"rows reserved for {fields[engine]['cache_tokens_per_row']} tokens whose requests were "
                       f"shorter, padded, or already finished kept the rest unused until their batch ended.")
    return head + "prompts padded to the batch's longest and rows whose answer ended while the batch ran on."


def _tail_words(fields: dict) -> str:
    """vLLM's internal fragmentation: the empty tail of each last block, against the requests' own lengths."""
    block, sizes = fields["vllm"]["block_size"], fields.get("tokens_per_request")
    said = f"the empty tail of each request's last block of {block} tokens"
    span = sizes and (f"{sizes['min']}" if sizes["min"] == sizes["max"] else f"{sizes['min']}-{sizes['max']}")
    if sizes and sizes["max"] < block:
        return said + (f"; every request here held {span} tokens, fewer than one block, so "
                       f"most of its one block stayed empty (smaller blocks, such as the 16 vLLM uses on a GPU, "
                       f"leave less).")
    if sizes:
        return said + f"; the requests held {span} tokens, so a last block is partly empty."
    return said + "."


def _paper_lines(fields: dict) -> list[str]:
    """The vLLM paper's published shares of KV memory holding tokens, beside this run's (measured)."""
    from lab.experiments.waste import PAPER

    low, high = PAPER["orca"]
    lines = [f"The vLLM paper found {low}-{high} % of KV memory holding tokens in Orca-style systems, which reserve "
             f"ahead, and {PAPER['vllm']} % in vLLM (published: Kwon et al., SOSP 2023, Fig. 2)."]
    static = (fields.get("hf-static") or {}).get("kinds_pct", {}).get("real")
    if static is not None:
        where = "within" if low <= static <= high else "below" if static < low else "above"
        lines.append(f"HF with a static cache kept {static} % here ({_kv_words('hf-static')}), {where} the paper's "
                     f"Orca range.")
    vllm = (fields.get("vllm") or {}).get("kinds_pct", {}).get("real")
    if vllm is not None:
        near = "close to" if vllm >= PAPER["vllm"] - 5 else "below"
        lines.append(f"vLLM kept {vllm} % here ({_kv_words('vllm')}), {near} the paper's {PAPER['vllm']} %"
                     + ("." if near == "close to" else f": a last block's empty tail is a larger share of a short "
                        f"request, and of a block of {fields['vllm']['block_size']} tokens."))
    return lines


def block_size_answer(fields: dict) -> list[str]:
    """vLLM's waste at each block size (measured where vLLM ran at it, computed where the same requests' tokens
    were cut into its blocks), what a running request held at each, and so how many such requests the same pool
    holds at once: the smallest measured block against the largest, then any computed one."""
    rows = [r for r in (fields.get("block_sizes") or {}).values() if r.get("waste_pct") is not None
            and r.get("requests_at_once")]
    if len(rows) < 2:
        return []
    rows.sort(key=lambda r: r["block_size"])
    waste = ", ".join(f"{r['waste_pct']} % in blocks of {r['block_size']} ({kind(r['origin'])})" for r in rows)
    measured = [r for r in rows if kind(r["origin"]) == "measured"]
    pair = measured if len(measured) > 1 else rows  # the effect as measured, where two sizes ran
    lines = [f"vLLM's KV that held no token, time-weighted: {waste}.", _block_effect(pair[0], pair[-1])]
    if len(measured) > 1:
        lines.append(_fit_words(measured[0], measured[-1]))
    lines += [_computed_fit(r, measured[-1]) for r in rows if kind(r["origin"]) == "computed" and measured]
    return lines


def _block_effect(small: dict, large: dict) -> str:
    """Whether the smaller block wasted less, and why it can: a last block's empty tail is shorter."""
    tail = (f"a request's last block leaves at most {small['block_size'] - 1} slots empty in blocks of "
            f"{small['block_size']}, {large['block_size'] - 1} in blocks of {large['block_size']}")
    if small["waste_pct"] < large["waste_pct"]:
        return f"Smaller blocks wasted less: {tail}."
    return f"Smaller blocks wasted no less here, though {tail}: these requests' tails happened to fit."


def _fit_words(small: dict, large: dict) -> str:
    """How many requests of this run's sizes the same pool holds at once at two measured block sizes."""
    more = small["requests_at_once"] - large["requests_at_once"]
    said = (f"A running request held {small['held_per_request']} KV slots on average in blocks of "
            f"{small['block_size']} and {large['held_per_request']} in blocks of {large['block_size']} (measured), so "
            f"the same pool of {large['pool_tokens']:,} tokens holds {small['requests_at_once']} such requests at once "
            f"against {large['requests_at_once']}")
    if more > 0:
        return said + f": {more} more at once ({small['requests_at_once'] / large['requests_at_once']:.2f}x)."
    return said + ": no more at once with the smaller blocks here."


def _computed_fit(row: dict, largest: dict) -> str:
    """A block size the lab computed rather than ran: the same requests, the same pool."""
    return (f"In blocks of {row['block_size']} (computed: the same requests' tokens cut into them) a request "
            f"would hold {row['held_per_request']} slots, and the pool {row['requests_at_once']} such requests at once "
            f"against {largest['requests_at_once']} in blocks of {largest['block_size']}.")


# -- the concurrency notebook (03): what users bought each kind of work ------------------------------------------
def gain_words(gain: float, spread: dict | None = None) -> str:
    """A tok/s gain from the fewest users to the most: 'gained 2.31x (repeats 2.10-2.52x)', 'lost: its tok/s fell
    to 0.47x', or, when the repeats straddle 1, no measured gain or loss."""
    many = spread is not None and spread["n"] > 1
    if many and not clear(spread):
        return (f"moved {gain:.2f}x, within its repeats' spread ({spread['low']:.2f}-{spread['high']:.2f}x): no "
                f"measured gain or loss")
    said = f"gained {gain:.2f}x" if gain >= 1 else f"lost: its tok/s fell to {gain:.2f}x"
    return said + (f" (repeats {spread['low']:.2f}-{spread['high']:.2f}x)" if many else "")


def _apart(a: dict | None, b: dict | None) -> bool:
    """Two gains' repeats do not overlap (one repeat each: nothing to say they do)."""
    if not a or not b or a["n"] < 2 or b["n"] < 2:
        return True
    return a["high"] < b["low"] or b["high"] < a["low"]


def phases_answer(fields: dict, most: int) -> list[str]:
    """Each engine's gain on decode- and prefill-bound work from the fewest users to ``most``, and which work and
    which engine gained more here (measured, with the repeats' spread)."""
    gains = {(w, e): fields[w][e]["gain"] for w in ("decode", "prefill") for e in ("hf", "vllm")}
    spreads = {(w, e): fields[w][e].get("gain_spread") for w in ("decode", "prefill") for e in ("hf", "vllm")}

    def words(key):
        return gain_words(gains[key], spreads[key])

    lines = [f"From 1 to {most} users HF {words(('decode', 'hf'))} on decode-bound work and "
             f"{words(('prefill', 'hf'))} on prefill-bound work; vLLM {words(('decode', 'vllm'))} "
             f"and {words(('prefill', 'vllm'))} (measured)."]
    if not _apart(spreads["decode", "vllm"], spreads["prefill", "vllm"]):
        lines.append("vLLM's decode and prefill gains overlap within their repeats' spread: no measured difference "
                     "between the two kinds of work here.")
    elif gains["decode", "vllm"] > gains["prefill", "vllm"]:
        lines.append("Decode gained more: a decode step reads every weight once to make one token per running "
                     "request, so more requests in a step make more tokens from the same read; a prefill already "
                     "keeps the device busy with a whole prompt.")
    else:
        lines.append("Here prefill gained as much as decode: the device was already busy with one request's decode "
                     "steps, so sharing them bought little.")
    return lines + [_hf_line(gains, spreads)]


def _hf_line(gains: dict, spreads: dict) -> str:
    if not _apart(spreads["decode", "hf"], spreads["decode", "vllm"]):
        return "On decode-bound work HF's and vLLM's gains overlap within their repeats' spread."
    if gains["decode", "hf"] < gains["decode", "vllm"]:
        return ("On decode-bound work HF gained less than vLLM: its batch is fixed when it starts (padding, waiting "
                "for the longest) while vLLM refills its batch every step.")
    return ("On decode-bound work HF gained as much as vLLM or more here: its static batches were filled as "
            "fully as vLLM's at these levels.")


def more_users_answer(decode: dict, more: dict, users: tuple[int, int]) -> list[str]:
    """The exercise: the decode-bound gain at more users against the first run's (measured) of each engine the
    exercise ran, and whether vLLM's tok/s kept growing with the users, flattened, or the repeats cannot say
    (growth_line)."""
    first, second = users
    said = [f"{ENGINE_LABELS[e]} {gain_words(decode[e]['gain'], decode[e].get('gain_spread'))} from 1 to {first} "
            f"users and {gain_words(more[e]['gain'], more[e].get('gain_spread'))} from 1 to {second}"
            for e in ("vllm", "hf") if e in more]
    return [f"On decode-bound work {'; '.join(said)} (measured).",
            growth_line(step_of(decode["vllm"], more["vllm"]), users)]


def step_of(first: dict, second: dict) -> dict:
    """The second gain over the first, with its spread: the repeats' own steps where measured (``step`` and
    ``step_spread``, lab.experiments.phases.step_up), else the widest the two gains' spreads allow."""
    if second.get("step_spread"):
        return {"value": second["step"], **second["step_spread"]}
    value = second["gain"] / first["gain"]
    a, b = first.get("gain_spread"), second.get("gain_spread")
    if not a or not b or min(a["n"], b["n"]) < 2:
        return {"value": value, "low": value, "high": value, "n": 1}
    return {"value": value, "low": b["low"] / a["high"], "high": b["high"] / a["low"], "n": min(a["n"], b["n"])}


def growth_bar(users: tuple[int, int]) -> float:
    """The step that counts as still growing with the users: half the users' growth (2x the users: 1.5x)."""
    return 1 + 0.5 * (users[1] / users[0] - 1)


def kept_growing(step: dict, users: tuple[int, int]) -> bool | None:
    """Whether every repeat's step reached growth_bar (True), none did (False), or the repeats straddle it (None:
    no verdict)."""
    bar = growth_bar(users)
    if step["low"] >= bar:
        return True
    return False if step["high"] < bar else None


def growth_line(step: dict, users: tuple[int, int]) -> str:
    """From ``users[0]`` to ``users[1]``: vLLM's tok/s step against growth_bar, judged on its repeats."""
    first, second = users
    said = (f"From {first} to {second} users ({second / first:.2f}x) vLLM's tok/s moved {step['value']:.2f}x "
            f"({spread_words(step)}); growing with the users means at least {growth_bar(users):.2f}x (half their "
            f"growth)")
    verdict = kept_growing(step, users)
    if verdict is None:
        return said + (": the repeats straddle that line, so this run cannot say whether it kept growing or "
                       "flattened (more repeats, or a higher level, would).")
    if verdict:
        return said + (": every repeat reached it, so it kept growing: a step was not yet compute-bound and the pool "
                       "held every running request.")
    how = ("the extra users bought no measured tok/s (the repeats straddle 1)" if not clear(step) else
           "it even fell, in every repeat" if step["high"] < 1 else "it grew, but short of the line in every repeat")
    return said + (f": {how}, so it flattened. A step is compute-bound once more rows cost as much as they make (on "
                   f"a 2-core CPU that comes early; on a GPU much later), or the KV pool cannot hold every running "
                   f"request.")


def capacity_guess_answer(prediction, data: dict) -> list[str]:
    """03's capacity exercise: the learner's predicted vLLM/HF capacity ratio beside the one the search found
    (computed from its measured probes, said by its bound), then the search's own sentences
    (lab.capacity.capacity_answer: the headline, what broke each engine's target first, Little's law, the repeats)."""
    from lab.capacity import capacity_answer

    return [guess_line(prediction, (data.get("ratios") or {}).get("vllm/hf")), *capacity_answer(data)]


def guess_line(prediction, ratio: dict | None) -> str:
    """A predicted ratio against a found one ({value, bound}: exact, at_least, at_most, unknown, none)."""
    if not ratio or ratio["value"] is None:
        return "The search found no ratio to set a prediction against: the headline below says why."
    value, bound = ratio["value"], ratio["bound"]
    said = f"{bound.replace('_', ' ') + ' ' if bound in ('at_least', 'at_most') else ''}{value:.2g}x"
    found = f"the capacities the search found give {said} ({kind('arithmetic')} from its measured probes)"
    if prediction is None:
        return f"You left your prediction blank; {found}."
    return f"You predicted {prediction}x; {found}: " + _guess_words(float(prediction), value, bound)


def _guess_words(guess: float, value: float, bound: str) -> str:
    """Whether a guess is above, below or at a ratio, or (for a bound) consistent with it."""
    if bound == "unknown":
        return "both capacities are lower bounds (each search stopped before a level missed), so neither side is shown."
    if bound == "at_least":
        return (f"your guess is within the bound: a search to more users could still find {guess:g}x." if guess >= value
                else "your guess is below what was found, even as a bound: vLLM served more users than you expected.")
    if bound == "at_most":
        return (f"your guess is within the bound: a search of HF to more users could still find {guess:g}x."
                if guess <= value else "your guess is above what was found, even as a bound.")
    if abs(guess / value - 1) <= 0.1:
        return "your guess matched it (within 10%)."
    return f"your guess was {'above' if guess > value else 'below'} it, {guess / value:.2g}x what was found."


def block_count_answer(fields: dict) -> list[str]:
    """The block count derived from token counts against vLLM's own at every step: how far apart, and why where
    they parted (measured)."""
    if not fields["samples"]:
        return ["vLLM was not sampled while it held blocks: there is nothing to compare."]
    said = (f"Over {fields['samples']} engine steps the two counts differed by at most {fields['max_abs_diff_blocks']} "
            f"block(s) (within one block per running request at every step: {fields['agree']}); the peak was "
            f"{fields['peak_used_blocks']} of {fields['num_blocks']} blocks (measured).")
    if not fields["max_abs_diff_blocks"]:
        return [said, "They agreed at every step sampled."]
    if fields["vllm_ahead"]:
        why = ("vLLM counted more: it allocates a request's next block when it schedules the step that writes the "
               "block's first token, and the derived count sees that token only when it arrives, one step later")
    else:
        why = ("the derived count counted more: it still held a request's blocks after vLLM had freed them, since a "
               "request's end reaches the client after the step that finished it")
    several = "; several requests crossed a block boundary in the same step" * (fields["max_abs_diff_blocks"] > 1)
    return [said, f"At the widest gap {why}{several}."]


def table_answer(fields: dict) -> list[str]:
    """What vLLM's real block ids showed: how many at once, scattered tables, reuse and sharing (measured)."""
    lines = [f"Up to {fields['most_at_once']} requests held blocks at once, in a pool of {fields['num_blocks']} blocks "
             f"of {fields['block_size']} tokens (ids read from vLLM after each of {fields['steps']} steps)."]
    scattered = fields["non_contiguous"]
    if scattered:
        request, ids = next(iter(scattered.items()))
        lines.append(f"{len(scattered)} request(s) held blocks that are not neighbours: {request} held {ids}. A block "
                     f"table maps a request's logical blocks to whatever physical blocks were free.")
    else:
        lines.append("Every request's blocks happened to be neighbours here: the pool gave out free blocks in order.")
    reused = fields["reused"]
    if reused:
        block, holders = next(iter(reused.items()))
        lines.append(f"{len(reused)} block(s) served more than one request in turn: block {block} held by "
                     f"{', then '.join(holders)}; a finished request's blocks go straight back to the pool.")
    lines += _shared_lines(fields["shared"], fields.get("most_holders"))
    return lines


# -- the prefix-caching notebook (05): hits measured beside the block rule's, and what they did to TTFT ---------
def _shared_lines(shared: dict, most: dict | None) -> list[str]:
    """The blocks held by several requests at once and the most holders of one at one step (an older result kept
    each block's count at the last step it was shared: said so, not called the most)."""
    if not shared:
        return []
    if most:
        return [f"{len(shared)} block(s) were held by several requests at once, up to {most['holders']} at once "
                f"(block {most['block']} after step {most['step']}): the shared prompt prefix, computed once and "
                f"reused by prefix caching."]
    return [f"{len(shared)} block(s) were held by several requests at once: the shared prompt prefix, computed once "
            f"and reused by prefix caching (this older result kept each block's count at the last step it was "
            f"shared, {max(shared.values())} at most, not the most at once)."]


def table_step_answer(view: dict, block_size: int) -> str:
    """One view of vLLM's block table: who holds how many blocks after a step, the most holders of one block then
    (and in the run, where more), and the blocks freed before it that are back on the free list (all read from
    vLLM: measured)."""
    tables, refs = view["tables"], view["refs"]
    said = (f"After step {view['step']}, {len(tables)} request{'s' * (len(tables) != 1)} hold{'s' * (len(tables) == 1)}"
            f" {len(refs)} block{'s' * (len(refs) != 1)}" if tables else f"After step {view['step']} no request holds "
            f"a block")
    parts = [said, _holders_words(view, block_size), _freed_words(view)]
    return "; ".join(p for p in parts if p) + f" (block ids and reference counts read from vLLM: {kind('engine')})."


def _holders_words(view: dict, block_size: int) -> str:
    """The blocks most requests hold at this step, which logical blocks they are for each, and the run's most."""
    refs, most = view["refs"], view["most"]
    top = max(refs.values(), default=0)
    if top < 2:
        said = "no block is shared at this step"
    else:
        tops = sorted(b for b, n in refs.items() if n == top)
        first, last = (view["logical"][b][0] for b in (tops[0], tops[-1]))  # the same in every holder: a prefix
        #                                                                     block's hash chains its position
        said = (f"block{'s' * (len(tops) > 1)} {_and(tops)} {'are each' if len(tops) > 1 else 'is'} held by {top} "
                f"at once (logical block{'s' * (len(tops) > 1)} {first}{f'-{last}' * (last > first)} of each: prompt "
                f"tokens {first * block_size}-{(last + 1) * block_size - 1}, the same in all, stored once)")
    if most and most["holders"] > top:
        said += f" (the run's most: {most['holders']} held block {most['block']} after step {most['step']})"
    return said


def _and(items: list) -> str:
    """'1', '1 and 2', '1, 2 and 3'."""
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _freed_words(view: dict) -> str:
    """The blocks freed before this step that are free now, those held now that served another request before,
    and vLLM's free count where the result has it."""
    freed, reused = view["freed"], view["reused"]
    said = (f"{len(freed)} block{'s' * (len(freed) != 1)} freed earlier {'are' if len(freed) != 1 else 'is'} back "
            f"on the free list ({', '.join(map(str, freed))})" if freed else "no block freed earlier is free now")
    if reused:
        said += f", and {len(reused)} held now served another request before ({', '.join(map(str, reused))})"
    if view["free"] is not None:
        said += f"; vLLM counts {view['free']} free blocks"
    return said


def prefix_answer(fields: dict, shared_tokens: int) -> list[str]:
    """Each order's hit rate (measured) beside the block rule's (computed), why they differ or agree, and whether
    the order changed time to first token beyond the repeats' spread."""
    first, last = fields["first"], fields["last"]
    if first["hit_rate"] is None or last["hit_rate"] is None:
        return ["vLLM reported no prefix-cache lookups for one of the orders: nothing to compare."]
    lines = [_order_line(order, fields[order]) for order in ("first", "last")]
    block, blocks = fields["block_size"], first["computed"]["full_blocks"]
    lines.append(f"vLLM hashes each full block of {block} tokens together with everything before it, so a block "
                 f"matches only if the whole prompt up to its end matches: the {shared_tokens} shared tokens fill "
                 f"{blocks} full block(s) (computed), which only the constant-first order puts at every prompt's "
                 f"start.")
    if first["hit_rate"] > last["hit_rate"]:
        lines.append(f"So the constant-first order found {first['hit_rate']:.0%} of its prompt tokens cached and the "
                     f"constant-last order {last['hit_rate']:.0%}.")
    else:
        lines.append(f"Here the constant-first order found no more cached ({first['hit_rate']:.0%}) than the last "
                     f"({last['hit_rate']:.0%}): no full block of the shared part came first in every prompt.")
    return lines + [ttft_words(fields)]


def _order_line(order: str, f: dict) -> str:
    rule = f["computed"]["hit_rate"]
    said = (f"Constant block {order}: {f['hit_rate']:.0%} of the {f['queried_tokens']:,} prompt tokens looked up hit "
            f"the cache (measured); the block rule gives {rule:.0%} (computed)")
    if abs(f["hit_rate"] - rule) <= 0.05:
        return said + ": the two agree."
    if f["hit_rate"] < rule:
        return said + ": fewer hit than the rule allows (requests that ran at once each computed the shared blocks " \
                      "before either was cached)."
    return said + ": more hit than the rule allows (some prompts' own parts began alike)."


def ttft_words(fields: dict) -> str:
    """Whether the constant-last order's TTFT differed from the constant-first's beyond the repeats' spread."""
    ratio, spread = fields.get("ttft_last_over_first"), fields.get("ttft_ratio_spread")
    first, last = (fields[o]["ttft_p50_s"] for o in ("first", "last"))
    if not ratio:
        return "No TTFT to compare."
    said = f"TTFT p50 {first * 1000:.0f} ms first vs {last * 1000:.0f} ms last, {ratio:.2f}x (measured"
    said += f"; repeats {spread['low']:.2f}-{spread['high']:.2f}x, n={spread['n']})" if spread and spread["n"] > 1 \
        else ", one repeat)"
    if spread and not clear(spread):
        return said + ": the repeats straddle 1, so the order made no measured difference to the first token here."
    if ratio > 1:
        return said + ": with its prefix cached, a request computed only its own tokens before its first token."
    return said + ": the constant-last order was not slower here; with prompts this short a step's fixed cost hides " \
                  "the cached tokens."


def short_prefix_answer(short: dict, long: dict, tokens: tuple[int, int]) -> list[str]:
    """The exercise: a shared part shorter than a block against the first run's (measured and computed)."""
    a, b = short["first"], long["first"]
    lines = [f"Constant block first: {a['hit_rate']:.0%} hit with {tokens[0]} shared tokens, {b['hit_rate']:.0%} "
             f"with {tokens[1]} (measured)."]
    blocks, block = a["computed"]["full_blocks"], short["block_size"]
    if blocks == 0:
        verb = "so nothing could be reused" if a["hit_rate"] <= 0.05 else "yet some tokens hit"
        lines.append(f"{tokens[0]} tokens fill no full block of {block} (computed): only full blocks are cached, "
                     f"{verb}. Put long, constant instructions first and make them at least a block long.")
    else:
        lines.append(f"{tokens[0]} tokens still fill {blocks} full block(s) of {block} (computed): those are reused.")
    return lines


# -- the sweeps and sharing notebooks (04, 06) --------------------------------------------------------------------
def queue_answer(first: dict, last: dict, users: str) -> str:
    """max_num_seqs at its smallest against its largest: did the queue show in TTFT more than in TPOT (measured)?"""
    ttft = first[f"ttft_p50_s@{users}"] / last[f"ttft_p50_s@{users}"]
    tpot = first[f"tpot_p50_s@{users}"] / last[f"tpot_p50_s@{users}"]
    said = (f"At max_num_seqs={first['value']} TTFT p50 was {ttft:.1f}x and TPOT p50 {tpot:.1f}x what they were at "
            f"{last['value']} (measured): ")
    if ttft > tpot * 1.2:
        return said + ("the queue cost first tokens more than the pace of a running answer: requests waited for "
                       "whole answers before them, and the running one decoded at single-user speed.")
    return said + ("the queue did not show in TTFT more than in TPOT here: with short answers the wait is short, and "
                   "with every sequence admitted at once their prompts share one long first step. To look for the "
                   "queue at more users and longer answers, run with SMALL = False.")


def tok_s_words(point: dict, users: str) -> str:
    """A sweep point's output tok/s at one level, with its repeats' spread when it has one (measured)."""
    spread = point.get(f"output_tok_s_spread@{users}")
    said = f"{point[f'output_tok_s@{users}']:.1f} tok/s at {point['value']}"
    return said + (f" (repeats {spread['low']:.1f}-{spread['high']:.1f}, n={spread['n']})" if spread else "")


def overlap(a: dict, b: dict, users: str) -> bool:
    """Two points' tok/s repeats overlap (no spread: they are taken as apart)."""
    x, y = a.get(f"output_tok_s_spread@{users}"), b.get(f"output_tok_s_spread@{users}")
    return bool(x and y) and x["low"] <= y["high"] and y["low"] <= x["high"]


def batch_answer(points: list[dict], users: str) -> list[str]:
    """HF's batch-size sweep: the most KV the largest batch held against the smallest (computed from its batch's
    shape), and what it bought in tok/s (measured; within the repeats' spread said so)."""
    first, last = points[0], points[-1]
    mib = [p[f"kv_peak_reserved_bytes@{users}"] / 2**20 for p in (first, last)]
    gain = last[f"output_tok_s@{users}"] / first[f"output_tok_s@{users}"]
    lines = [f"Peak KV held: {mib[0]:.1f} MiB at batch {first['value']}, {mib[1]:.1f} MiB at {last['value']} "
             f"({_kv_words('hf')}); tok/s {tok_s_words(first, users)}, {tok_s_words(last, users)} ({gain:.2f}x, "
             f"measured)."]
    if overlap(first, last, users):
        return lines + ["The two batch sizes' tok/s overlap within their repeats' spread: the larger batch bought no "
                        "measured speed here, only memory held for rows."]
    if gain > 1.2:
        return lines + ["A bigger static batch holds batch x its longest padded length so far, and here it bought "
                        "tokens too: one step serves several rows for little more than the cost of one."]
    return lines + ["Here the larger batch bought almost no speed: on this device a step of several rows cost nearly "
                    "as much as that many single steps, and padded rows computed for nothing. Where one row leaves "
                    "the device idle (a GPU's sweeps: docs/benchmarks.md), the same sweep can multiply tok/s."]


def blocks_answer(points: list[dict], users: str) -> list[str]:
    """The block-size sweep: blocks in the pool (vLLM's count) and tok/s at each size (measured)."""
    pools = ", ".join(f"{p['kv_total_blocks']} of {p['kv_block_size']} tokens" for p in points)
    lines = [f"Blocks in the pool: {pools}; output tok/s: {', '.join(tok_s_words(p, users) for p in points)} "
             f"(measured)."]
    tokens = [p["kv_total_blocks"] * p["kv_block_size"] for p in points]
    same = max(tokens) - min(tokens) <= max(p["kv_block_size"] for p in points)
    lines.append("The same bytes held the same tokens (within a block): smaller blocks, more of them; each request's "
                 "last block wastes less." if same else
                 f"The pools held {min(tokens):,}-{max(tokens):,} tokens: the budget did not divide evenly here.")
    fast = max(points, key=lambda p: p[f"output_tok_s@{users}"])
    if len(points) > 1 and overlap(points[0], points[-1], users):
        lines.append("Their tok/s overlap within the repeats' spread: the block size cost no measured speed here.")
    else:
        lines.append(f"Blocks of {fast['kv_block_size']} tokens were fastest here.")
    return lines


def pool_answer(points: list[dict], users: str, unit: str = " GiB") -> list[str]:
    """A sweep that sizes vLLM's pool (KV budget, memory share): where the pool filled (its peak read full, or vLLM
    preempted) and where preemption stopped, and what the smallest pool cost in tok/s and TTFT against the largest
    (measured; a point whose preemption counter was never read is left out of those words)."""
    points = [p | {"value": f"{p['value']}{unit}"} for p in sorted(points, key=lambda p: p["kv_total_blocks"])]
    key = f"preemptions@{users}"
    preempted = [p for p in points if p.get(key)]
    full = [p for p in points if p[f"kv_peak_used_blocks@{users}"] >= p["kv_total_blocks"] or p in preempted]
    held = ", ".join(f"{p[f'kv_peak_used_blocks@{users}']:,} of {p['kv_total_blocks']:,}" for p in points)
    lines = [f"Peak blocks used of the pool at {users} users: {held} (measured)."]
    above = [p for p in points if full and p["kv_total_blocks"] > full[-1]["kv_total_blocks"]]
    if not full:
        lines.append("No pool filled: every budget held this load's peak.")
    elif not above:
        lines.append("The largest pool measured filled too: a larger one shows where the budget stops mattering.")
    else:
        lines.append(f"The pool filled up to {full[-1]['value']}; from {above[0]['value']} it had room: this load's "
                     f"peak used {above[0][f'kv_peak_used_blocks@{users}']:,} blocks.")
    if preempted:
        rest = points[points.index(preempted[-1]) + 1:]
        counts = ", ".join(f"{p[key]} at {p['value']}" for p in preempted)
        lines.append(f"vLLM preempted running requests ({counts}): a full pool made it free a request's blocks and "
                     "recompute it later" + (f"; none from {rest[0]['value']} up." if rest and all(
                         p.get(key) == 0 for p in rest) else "."))
    elif all(p.get(key) == 0 for p in points):
        lines.append("vLLM's counter showed no preemption at any budget.")
    small, large = points[0], points[-1]
    ttft = [p[f"ttft_p50_s@{users}"] for p in (small, large)]
    lines.append(f"The smallest pool made {tok_s_words(small, users)} against {tok_s_words(large, users)}, TTFT p50 "
                 f"{ttft[0]:.2f} s against {ttft[1]:.2f} s (measured).")
    return lines


def fanout_answer(separate: dict) -> str:
    """Whether four separate requests of one prompt found its blocks in the prefix cache (measured)."""
    hit = separate["prefix_hit_tokens"]
    if hit:
        return (f"Four separate requests of the same prompt shared too: {hit} prompt tokens hit the prefix cache "
                f"(in this vLLM, n=4 fans out into four requests that find the prompt's blocks there).")
    return ("Four separate requests of the same prompt found nothing in the prefix cache here: each computed and held "
            "the prompt's blocks itself.")


# -- the chat workload: what re-sending the history cost, per turn ------------------------------------------------
def chat_answer(summary: dict) -> list[str]:
    """Per engine and user level, its first turn against its last: prompt, prefix-cache hits and TTFT (measured)."""
    lines = []
    blocks = {run["engine"]: (run.get("kv") or {}).get("block_size") for run in summary.get("runs", [])}
    args = summary.get("engine_args") or {}
    for (engine, users), rows in _first_repeat_turns(summary).items():
        if len(rows) > 1:
            off = (args.get(engine) or {}).get("enable_prefix_caching") is False
            lines.append(_turn_line(engine, users, rows, blocks.get(engine), off))
    return lines


def _first_repeat_turns(summary: dict) -> dict[tuple[str, int], list[dict]]:
    """The per-turn rows of each engine and level's first repeat, turns ascending."""
    found: dict[tuple[str, int], list[dict]] = {}
    for row in summary.get("turns") or []:
        if row["repeat"] == 0:
            found.setdefault((row["engine"], row["users"]), []).append(row)
    return found


def _turn_line(engine: str, users: int, rows: list[dict], block: int | None, off: bool = False) -> str:
    """One engine's turn 1 against its last turn, the cache's share said only where the engine reports it
    (``off``: its prefix cache was turned off)."""
    first, before, last = rows[0], rows[-2], rows[-1]
    said = (f"{engine} at {users} users: turn {first['turn']} prompts averaged {first['prompt_tokens_mean']:.0f} "
            f"tokens, turn {last['turn']} {last['prompt_tokens_mean']:.0f} (the history re-sent); ")
    if first["ttft_p50_s"] and last["ttft_p50_s"]:
        grew = last["ttft_p50_s"] / first["ttft_p50_s"]
        said += (f"TTFT p50 went from {first['ttft_p50_s'] * 1000:.0f} to {last['ttft_p50_s'] * 1000:.0f} ms "
                 f"({grew:.2f}x, measured). ")
    hit = last["prefix_hit_rate"]
    if off:
        return said + (f"Its prefix cache was off (enable_prefix_caching=False): it computed every one of the "
                       f"{last['prompt_tokens_mean']:.0f} prompt tokens again at turn {last['turn']}.")
    if hit is None:
        return said + (f"It reports no prefix cache: it computed every one of the {last['prompt_tokens_mean']:.0f} "
                       f"prompt tokens again at turn {last['turn']}.")
    if hit > (first["prefix_hit_rate"] or 0):
        return said + (f"Its prefix cache served {hit:.0%} of turn {last['turn']}'s prompt tokens (against "
                       f"{first['prefix_hit_rate']:.0%} at turn {first['turn']}): the history's whole blocks were not "
                       f"computed again.")
    said += f"Its prefix cache served {hit:.0%} of turn {last['turn']}'s prompt tokens, no more than at turn "
    said += f"{first['turn']}: "
    if block and before["prompt_tokens_mean"] < block:
        return said + (f"it keeps whole blocks of {block} tokens only, and turn {before['turn']}'s prompts averaged "
                       f"{before['prompt_tokens_mean']:.0f} tokens, less than a block: the history was computed again.")
    return said + "the history was computed again: its blocks were no longer cached when the turn came (evicted)."


def plan_answer(fields: dict, device: str) -> list[str]:
    """The memory plan's arithmetic (computed), how many full-length requests fit, and what the budget is a share
    of on this device."""
    return plan_lines(fields) + ([] if fields.get("refused") else [budget_line(device)])


def plan_lines(fields: dict) -> list[str]:
    """The memory plan's arithmetic and how many full-length requests fit (computed), or the planner's refusal."""
    from lab.environment import gib

    if fields.get("refused"):
        return [f"vLLM would refuse this setting (computed): {fields['reason']}"]
    from lab.metrics.kv import blocks_for

    blocks_one = blocks_for(fields["max_model_len"], fields["block_size"])
    lines = [f"{gib(fields['kv_bytes_planned'])} of KV / ({fields['kv_bytes_per_token']:,} bytes per token x "
             f"{fields['block_size']} tokens per block) = {fields['kv_blocks_planned']} blocks, one kept aside by "
             f"vLLM; one {fields['max_model_len']}-token request needs {blocks_one} blocks, so "
             f"{fields['max_len_requests_at_once']} fit at once (computed)."]
    lines += list(fields.get("notes", []))
    fit = fields["max_len_requests_at_once"]
    lines.append(f"{'Not even one' if fit < 1 else fit} full-length request{'s' if fit != 1 else ''} fit: vLLM "
                 + ("refuses to start." if fit < 1 else "starts, since it refuses only when not even one fits. Most "
                    "requests are far shorter and hold only the blocks their tokens fill, so more run at once; when "
                    "the pool is full, new ones wait and running ones may be preempted (section 3)."))
    return lines


def budget_line(device: str) -> str:
    """What vLLM's KV budget is a share of on this device kind ('cuda' or 'cpu')."""
    if device == "cuda":
        return ("On a GPU the fraction is of the card's total memory, not of what is free: two engines on one card "
                "must split it (their fractions add up to less than 1), or the second one fails to start.")
    return "On a CPU the budget is kv_cache_gib, set apart in host memory for vLLM's blocks."


def sharing_answer(fields: dict, n: int) -> list[str]:
    """Peak blocks of one answer, n answers in one request and n separate requests (measured), against n
    unshared copies (computed), and whether the prompt's blocks were shared."""
    one, many = fields["one"]["peak_blocks"], fields[f"n={n} in one request"]["peak_blocks"]
    unshared = fields["unshared_blocks_estimate"]
    lines = [f"Peak blocks: {one} for one answer, {many} for n={n} in one request (measured); {n} unshared copies "
             f"would hold {unshared} ({n} x {one}, computed)."]
    if many < unshared:
        lines.append(f"The {n} answers held {unshared - many} fewer blocks than unshared copies: the prompt's full "
                     f"blocks were computed once and held once, and each answer added only its own partly filled last "
                     f"block and its output.")
    else:
        lines.append(f"The {n} answers held as many blocks as unshared copies: nothing was shared here (a prompt "
                     f"shorter than one block has no full block to share).")
    return lines + [fanout_answer(fields[f"{n} separate requests"])]


def more_answers(fewer: dict, more: dict, counts: tuple[int, int]) -> list[str]:
    """The exercise: what each extra answer cost in blocks (measured), against an unshared copy (measured)."""
    a, b = (f[f"n={k} in one request"]["peak_blocks"] for f, k in ((fewer, counts[0]), (more, counts[1])))
    each, copy = (b - a) / (counts[1] - counts[0]), more["one"]["peak_blocks"]
    lines = [f"Peak blocks: {a} with n={counts[0]}, {b} with n={counts[1]} (measured); unshared, n={counts[1]} would "
             f"hold {more['unshared_blocks_estimate']} (computed)."]
    if each < copy:
        lines.append(f"Each extra answer added {each:.1f} blocks against {copy} for a whole copy of one answer: it "
                     f"added only its own last block and output; the prompt's full blocks stayed held once.")
    else:
        lines.append(f"Each extra answer added {each:.1f} blocks, as many as a whole copy ({copy}): no sharing "
                     f"showed here.")
    return lines


def preemption_answer(fields: dict, guess) -> list[str]:
    """The reader's guess, then the small pool against the normal one (preemption_lines)."""
    first, *rest = preemption_lines(fields)
    return [f"You guessed {guess!r}. {first}", *rest]


def preemption_lines(fields: dict) -> list[str]:
    """The small pool against the normal one: failures, waits, preemptions and tok/s (measured)."""
    small, normal = fields["small"], fields["normal"]
    lines = [f"Small pool ({small['kv_blocks']} blocks): {small['completed']} completed, "
             f"{small['errors']} errors, {small['preemptions']} preemption(s), {small['output_tok_s']:.1f} tok/s. "
             f"Normal pool ({normal['kv_blocks']} blocks): {normal['preemptions']} preemptions, "
             f"{normal['output_tok_s']:.1f} tok/s (measured)."]
    said = "No request failed: " if not small["errors"] else f"{small['errors']} request(s) failed: "
    said += f"requests waited (up to {small['peak_waiting']} at once) "
    if small["preemptions"]:
        said += (f"and {small['preemptions']} time(s) a running request needed a block the pool did not have, so "
                 f"vLLM preempted one (the lowest-priority running request) to make room. ")
    else:
        said += ("and every running request found its next block, so nothing was preempted this time (more users or "
                 "longer answers would). ")
    if normal["output_tok_s"]:
        ratio = small["output_tok_s"] / normal["output_tok_s"]
        said += f"The small pool made {ratio:.2f}x the normal pool's tok/s: " + (
            "with fewer blocks, fewer requests could run at once." if ratio < 1 else "no slower here.")
    return lines + [said, f"Preemption mode: {fields['preemption_mode']}."]


# -- a stored result's sentences (lab report): one helper per experiment and per swept knob ----------------------
EXPERIMENT_ANSWERS = {  # experiment -> (its fields, its params) -> lines; every argument is the result's own
    "cache": lambda f, p: cache_answer(f),
    "waste": lambda f, p: waste_answer(f) + (kinds_answer(f) if any("kinds_pct" in (f.get(e) or {})
                                                                    for e in ENGINE_LABELS) else []) +
    block_size_answer(f),
    "table": lambda f, p: table_answer(f),
    "prefix": lambda f, p: prefix_answer(f, p["shared_tokens"]),
    "phases": lambda f, p: phases_answer(f, max(p["users"])),
    "sharing": lambda f, p: sharing_answer(f, p["n"]),
    "preemption": lambda f, p: preemption_lines(f),
    "memory": lambda f, p: plan_lines(f),  # a stored plan keeps its device's name, not its kind: no budget_line
    "why": lambda f, p: [line.removeprefix("- ") for line in why_caption(f).splitlines()],
}
SWEEP_ANSWERS = {  # knob -> (points, users) -> lines
    "hf_max_batch_size": batch_answer, "block_size": blocks_answer, "kv_cache_gib": pool_answer,
    "gpu_memory_utilization": lambda points, users: pool_answer(points, users, " of the card")}


def experiment_answer(name: str, fields: dict, params: dict) -> list[str]:
    """What the lab says about a stored experiment, from its fields and params (none where it has no helper)."""
    answer = EXPERIMENT_ANSWERS.get(name)
    return _held(answer, fields, params) if answer else []


def sweep_answer(sweep: dict) -> list[str]:
    """What the lab says about a stored sweep of at least two values, per user level (sweep.json's dict)."""
    answer, points = SWEEP_ANSWERS.get(sweep.get("knob")), sweep.get("points", [])
    if answer is None or len(points) < 2:
        return []
    return [line for users in sweep.get("load", {}).get("users", ()) for line in _held(answer, points, str(users))]


def _held(answer, *args) -> list[str]:
    """The helper's lines, or none where the result lacks a figure they rest on (a partial or an older result):
    a sentence whose premise the result does not hold is not printed."""
    try:
        return answer(*args)
    except (KeyError, TypeError, IndexError, ZeroDivisionError):
        return []
