"""A sweep in words (notebook 04, the Sweeps tab, reports): per swept knob, what its smallest value cost or bought
against its largest (measured; within the repeats' spread said so), and ``sweep_answer`` for a stored sweep.
"""

from __future__ import annotations

from lab.words import held, kv_words


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
             f"({kv_words('hf')}); tok/s {tok_s_words(first, users)}, {tok_s_words(last, users)} ({gain:.2f}x, "
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
        lines.append(f"Blocks of {fast['kv_block_size']} tokens were fastest here. " + _gap_reason(points, fast, users))
    return lines


def _gap_reason(points: list[dict], fast: dict, users: str) -> str:
    """Why the slowest block size was slower, where the run has a reason: it preempted more, or its pool filled
    (measured); else that this run does not explain the gap."""
    slow = min(points, key=lambda p: p[f"output_tok_s@{users}"])
    ratio = fast[f"output_tok_s@{users}"] / slow[f"output_tok_s@{users}"]
    said = f"Blocks of {slow['kv_block_size']} made {1 / ratio:.2f}x their tok/s"
    pre, used = f"preemptions@{users}", f"kv_peak_used_blocks@{users}"
    if None in (fast.get(pre), slow.get(pre), fast.get(used), slow.get(used)):
        return said + ": this run read no preemption count or peak to explain it."
    if slow[pre] > fast[pre]:
        return said + (f", and vLLM preempted {slow[pre]} time(s) there against {fast[pre]} (measured): a preempted "
                       f"request's blocks are freed and its tokens computed again.")
    if slow[used] >= slow["kv_total_blocks"] > fast[used]:
        return said + (f", and its pool filled ({slow[used]} of {slow['kv_total_blocks']} blocks, measured) where "
                       f"the other's peaked at {fast[used]} of {fast['kv_total_blocks']}: fewer requests ran at once.")
    return said + (f"; neither preemptions ({slow[pre]} against {fast[pre]}) nor a full pool (peaks {slow[used]} of "
                   f"{slow['kv_total_blocks']} and {fast[used]} of {fast['kv_total_blocks']} blocks) explain it "
                   f"(measured): this run does not say why. The attention kernel's cost per block size, not timed "
                   f"here, is one candidate.")


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


SWEEP_ANSWERS = {  # knob -> (points, users) -> lines
    "hf_max_batch_size": batch_answer, "block_size": blocks_answer, "kv_cache_gib": pool_answer,
    "gpu_memory_utilization": lambda points, users: pool_answer(points, users, " of the card")}


def sweep_answer(sweep: dict) -> list[str]:
    """What the lab says about a stored sweep of at least two values, per user level (sweep.json's dict)."""
    answer, points = SWEEP_ANSWERS.get(sweep.get("knob")), sweep.get("points", [])
    if answer is None or len(points) < 2:
        return []
    return [line for users in sweep.get("load", {}).get("users", ()) for line in held(answer, points, str(users))]
