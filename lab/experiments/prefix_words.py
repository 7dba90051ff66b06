"""The prefix experiment in words (notebook 05): each order's prefix-cache hits (measured) beside the block rule's
(computed), why they differ or agree, and whether the order changed time to first token beyond the repeats'
spread.
"""

from __future__ import annotations

from lab.experiments.ladder import clear


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
    """Whether the constant-last order's TTFT differed from the constant-first's beyond the repeats' spread: the
    milliseconds and their ratio from one statistic (each order's median over its repeats), the paired repeats'
    ratios as the spread."""
    spread = fields.get("ttft_ratio_spread")
    first, last = (fields[o]["ttft_p50_s"] for o in ("first", "last"))
    if not first or not last:
        return "No TTFT to compare."
    ratio = last / first
    said = (f"TTFT p50 {first * 1000:.0f} ms first vs {last * 1000:.0f} ms last, {ratio:.2f}x (measured; each "
            f"order's median over its repeats")
    said += f"; the paired repeats' ratios {spread['low']:.2f}-{spread['high']:.2f}x, n={spread['n']})" \
        if spread and spread["n"] > 1 else ", one repeat)"
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
