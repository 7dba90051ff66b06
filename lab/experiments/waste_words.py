"""The waste experiment in words (notebook 02): which engine held more KV that held no token, by the vLLM paper's
three kinds, why (from the run's own shapes), the paper's published shares beside this run's, and what a smaller
block bought in requests at once.
"""

from __future__ import annotations

from lab.engines import registry
from lab.experiments.waste import PAPER, STATIC
from lab.metrics.kv import blocks_for
from lab.words import kv_words
from lab.words.labels import kind

ROW_LABELS = {"hf": registry.label("hf"), STATIC: "HF with a static cache", "vllm": registry.label("vllm")}


def waste_answer(fields: dict) -> list[str]:
    """Which engine wasted more KV (time-weighted, measured), and the reason the run's own shapes give."""
    hf, vllm = fields["hf"]["waste_pct"]["mean"], fields["vllm"]["waste_pct"]["mean"]
    block = fields["vllm"]["block_size"]
    more = ROW_LABELS["hf" if hf > vllm else "vllm"]
    lines = [f"{more} wasted more here: HF {hf} % of the KV it held ({kv_words('hf')}), vLLM {vllm} % "
             f"({kv_words('vllm')}; time-weighted means)."]
    if vllm >= hf:
        lines.append(f"vLLM's waste is the empty tail of each request's last block: {_last_block_words(fields)}. "
                     f"HF's ({hf} %) is padding and finished rows, and this load gave it less of both.")
    else:
        lines.append(f"HF's waste is padding (prompts padded to the batch's longest) and rows whose answer ended while "
                     f"the batch ran on; vLLM's is only the empty tail of each request's last block of {block}.")
    return lines


def _last_block_words(fields: dict) -> str:
    """How many blocks the run's requests held (computed from their measured tokens), so how much of their KV one
    partly empty last block is."""
    block, sizes = fields["vllm"]["block_size"], fields.get("tokens_per_request")
    if not sizes:
        return f"in blocks of {block} tokens each request's last block is partly empty"
    low, high = blocks_for(sizes["min"], block), blocks_for(sizes["max"], block)
    if sizes["max"] < block:
        return (f"the requests held {_span(sizes)} tokens, fewer than one block of {block}, so most of each one's "
                f"only block stayed empty")
    count = f"{low}" if low == high else f"{low}-{high}"
    tail = (f", whose last holds {sizes['min'] - (low - 1) * block} of its {block} slots at the end"
            if sizes["min"] == sizes["max"] else "")
    return (f"the requests held {_span(sizes)} tokens, {count} blocks of {block} each (computed){tail}: one partly "
            f"empty last block among {count}")


def _span(sizes: dict) -> str:
    return f"{sizes['min']}" if sizes["min"] == sizes["max"] else f"{sizes['min']}-{sizes['max']}"


def at_most_held_words(fields: dict) -> str:
    """Each engine's waste at the moment it held the most KV (a moment's share, not its highest), or, where the
    requests' tokens counted then exceeded what the engine held, that the moment's waste is not known."""
    parts = []
    for engine in ("hf", "vllm"):
        waste = (fields.get(engine) or {}).get("waste_pct") or {}
        if waste.get("peak_counted_over"):
            parts.append(f"{ROW_LABELS[engine]} not known (the requests' tokens counted then exceeded the "
                         f"{waste.get('peak_held_tokens', 0):,} slots it held: token arrivals and its block counts "
                         f"are read at different instants)")
        elif waste.get("peak") is not None:
            parts.append(f"{ROW_LABELS[engine]} {waste['peak']} %")
    return ("At the moment each engine held the most KV, the share holding no token: " + "; ".join(parts)
            + " (one moment's share, not the highest; the time-weighted means weigh every moment).")


def waste_change(first: dict, second: dict, names: tuple[str, str]) -> str:
    """Two waste runs on different loads: whose time-weighted waste moved more (measured), in points."""
    moves = {e: second[e]["waste_pct"]["mean"] - first[e]["waste_pct"]["mean"] for e in ("hf", "vllm")
             if (first.get(e) or {}).get("waste_pct", {}).get("mean") is not None
             and (second.get(e) or {}).get("waste_pct", {}).get("mean") is not None}
    if len(moves) < 2:
        return "One of the runs measured no waste for an engine: nothing to compare."
    said = "; ".join(f"{ROW_LABELS[e]}'s {_points(v)}" for e, v in moves.items())
    more = max(moves, key=lambda e: abs(moves[e]))
    return (f"From `{names[0]}` to `{names[1]}` {said} (time-weighted waste; HF's {kv_words('hf')}, vLLM's "
            f"{kv_words('vllm')}): {ROW_LABELS[more]}'s waste changed more.")


def _points(change: float) -> str:
    return "did not move" if abs(change) < 0.05 else f"{'rose' if change > 0 else 'fell'} {abs(change):.1f} points"


KIND_NAMES = {"reservation": "reservation", "internal": "internal fragmentation",
              "external": "external fragmentation"}


def kinds_answer(fields: dict) -> list[str]:
    """The three kinds of waste side by side (measured), the engine that kept the most of its KV holding tokens,
    each engine's largest kind and why, then the vLLM paper's published shares beside this run's."""
    engines = [e for e in (STATIC, "hf", "vllm") if (fields.get(e) or {}).get("kinds_pct", {}).get("real")
               is not None]
    if not engines:
        return ["No engine held KV long enough to split its memory by kind."]
    lines = [_kinds_line(e, fields[e]["kinds_pct"]) for e in engines]
    best = max(engines, key=lambda e: fields[e]["kinds_pct"]["real"])
    lines.append(f"{ROW_LABELS[best]} kept the largest share of its KV holding tokens here.")
    lines += [_largest_kind(e, fields) for e in engines]
    return [line for line in lines if line] + _paper_lines(fields)


def _kinds_line(engine: str, kinds: dict) -> str:
    held = f"{ROW_LABELS[engine]}: {kinds['real']} % of the KV it held held tokens; "
    if engine == "vllm":  # its blocks are counted only while a request holds tokens in them: two kinds are 0 by design
        return held + (f"internal fragmentation {kinds['internal']} % (memory x time, measured); reservation and "
                       "external fragmentation 0 by design, not measured apart (a block is taken when a token needs "
                       "it, and any free block serves any request).")
    return held + (f"reservation {kinds['reservation']} %, internal fragmentation {kinds['internal']} %, external "
                   f"fragmentation {kinds['external']} % (memory x time, {kv_words(engine)}).")


def _largest_kind(engine: str, fields: dict) -> str:
    """Why an engine's largest kind of waste was what it was, from the run's own shapes."""
    kinds = fields[engine]["kinds_pct"]
    kind = max(KIND_NAMES, key=lambda k: kinds[k])
    if not kinds[kind]:
        return f"{ROW_LABELS[engine]} wasted nothing measurable here."
    head = f"{ROW_LABELS[engine]}'s largest waste was {KIND_NAMES[kind]} ({kinds[kind]} %): "
    if engine == "vllm":
        return head + _tail_words(fields)
    if kind == "reservation":
        return head + (f"every row was reserved for the load's longest request "
                       f"({fields[engine]['cache_tokens_per_row']} tokens) before its first token, so each running "
                       f"request's tokens to come sat in slots held for them.")
    if kind == "external":
        return head + "batches gathered fewer requests than the cache has rows; the rows left over held no request."
    if engine == STATIC:
        return head + (f"rows reserved for {fields[engine]['cache_tokens_per_row']} tokens whose requests were "
                       f"shorter, padded, or already finished kept the rest unused until their batch ended.")
    return head + "prompts padded to the batch's longest and rows whose answer ended while the batch ran on."


def _tail_words(fields: dict) -> str:
    """vLLM's internal fragmentation: the empty tail of each last block, against the requests' own lengths."""
    block, sizes = fields["vllm"]["block_size"], fields.get("tokens_per_request")
    said = f"the empty tail of each request's last block of {block} tokens"
    span = sizes and _span(sizes)
    if sizes and sizes["max"] < block:
        return said + (f"; every request here held {span} tokens, fewer than one block, so "
                       f"most of its one block stayed empty (smaller blocks, such as the 16 vLLM uses on a GPU, "
                       f"leave less).")
    if sizes:
        return said + f"; the requests held {span} tokens, so a last block is partly empty."
    return said + "."


def _paper_lines(fields: dict) -> list[str]:
    """The vLLM paper's published shares of KV memory holding tokens, beside this run's (measured)."""
    low, high = PAPER["orca"]
    lines = [f"The vLLM paper found {low}-{high} % of KV memory holding tokens in Orca-style systems, which reserve "
             f"ahead, and {PAPER['vllm']} % in vLLM (published: Kwon et al., SOSP 2023, Fig. 2)."]
    static = (fields.get(STATIC) or {}).get("kinds_pct", {}).get("real")
    if static is not None:
        where = "within" if low <= static <= high else "below" if static < low else "above"
        lines.append(f"HF with a static cache kept {static} % here ({kv_words('hf-static')}), {where} the paper's "
                     f"Orca range.")
    vllm = (fields.get("vllm") or {}).get("kinds_pct", {}).get("real")
    if vllm is not None:
        near = "close to" if vllm >= PAPER["vllm"] - 5 else "below"
        lines.append(f"vLLM kept {vllm} % here ({kv_words('vllm')}), {near} the paper's {PAPER['vllm']} %"
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
