"""The cache experiment in words (notebook 02's opener): how time per token grew with length with the KV cache and
without it (measured), then what the cache costs in bytes: grouped-query attention and vLLM's pool (computed beside
vLLM's own count).
"""

from __future__ import annotations

from lab.experiments.cache import growth


def cache_answer(fields: dict) -> list[str]:
    """How time per token grew with length each way (measured), then the cache's bytes: GQA and the pool."""
    return cache_time_lines(fields) + memory_lines(fields)


def cache_time_lines(fields: dict) -> list[str]:
    """How time per token grew with length with the cache and without it (measured): the cache's answer before its
    bytes are asked for, then any length where the cache did not pay and what it saved at the longest."""
    series = fields["ms_per_token"]
    (short, a), (long, b) = series["with cache"][0], series["with cache"][-1]
    c, d = series["without cache"][0][1], series["without cache"][-1][1]
    lines = [f"With the cache a token took {a:.1f} ms at {short} tokens and {b:.1f} ms at {long}; without it, "
             f"{c:.1f} ms and {d:.1f} ms (measured)."]
    without, with_ = growth(fields, "without cache"), growth(fields, "with cache")
    if without > with_ * 1.1:
        lines.append(f"Without the cache each step recomputes the keys and values of the whole sequence so far, so its "
                     f"cost {_moved(without)} over these lengths; with the cache it {_moved(with_)}.")
    else:
        lines.append(f"At these lengths recomputing the past did not show (without the cache a token's cost "
                     f"{_moved(without)}, with it {_moved(with_)}): a step's fixed cost hides it; try longer lengths.")
    return lines + _slower_lines(series) + [_saving_line(long, b, d)]


def _moved(factor: float) -> str:
    """A cost's change from the shortest length to the longest: 'grew 1.5x', 'fell to 0.63x', or 'stayed within
    5%'."""
    if abs(factor - 1) <= 0.05:
        return f"stayed within 5% ({factor:.2f}x)"
    return f"grew {factor:.1f}x" if factor > 1 else f"fell to {factor:.2f}x"


def _slower_lines(series: dict) -> list[str]:
    """Lengths where a token took longer with the cache than without it (measured): the cache did not pay there. The
    experiment decodes with the cache first at its shortest length, so that point is its first decode."""
    without = dict(series["without cache"])
    slower = [(n, ms, without[n]) for n, ms in series["with cache"] if n in without and ms > without[n]]
    if not slower:
        return []
    said = ", ".join(f"{n} tokens ({ms:.1f} against {other:.1f} ms)" for n, ms, other in slower)
    first = slower[0][0] == series["with cache"][0][0]
    return [f"At {said} a token took longer with the cache than without it (measured): the cache's saving does not "
            f"show there" + ("; that was the experiment's first decode, which may carry a one-off warm-up this run "
                             "does not separate." if first else ".")]


def _saving_line(length: int, with_ms: float, without_ms: float) -> str:
    """What the cache saved at the longest length (measured), and whether that is much."""
    saved = 1 - with_ms / without_ms
    if saved >= 0.2:
        return f"At {length} tokens the cache saved {saved:.0%} of a token's time (measured)."
    if saved > 0:
        return (f"At {length} tokens the cache saved only {saved:.1%} of a token's time (measured): this device "
                f"recomputes a {length}-token past for little more than reading it, so at these lengths the "
                f"cache's point does not show.")
    return (f"At {length} tokens the cache saved nothing ({with_ms:.1f} against {without_ms:.1f} ms, measured): on "
            f"this device recomputing a {length}-token past cost no more than reading it.")


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
