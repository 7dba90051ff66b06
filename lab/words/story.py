"""The one story the notebooks tell, and where each notebook's own finding sits in it, computed from its run.

A KV cache saves recomputing the past: a step computes one token's keys and values and reads the rest (02's
opener). Paging holds that cache with less waste: no slots reserved for tokens not made yet, no padded rows or
rows of finished requests, only each request's partly filled last block (02). Memory not wasted holds more requests
at once, and a step that runs more requests makes more tokens. The other factor is what one step costs, vLLM's
against HF's (07). Over a level the two, with the busy fraction, multiply to the ratio exactly
(lab.metrics.steps):

    vLLM / HF = output tokens per step (vLLM / HF) x time per step (HF / vLLM) x busy fraction (vLLM / HF)

``place(link, finding)`` frames one computed finding at its link of that chain: every notebook ends with one such
sentence (notebooks 03, 05 and 06 call it with their own findings). Which factor made a level's lead is decided
once, by ``lab.metrics.steps_words.larger`` (the factor farthest from 1 among those clear of their repeats' spread), and
said once, by ``level_words``, so that notebook 01's sentence and notebook 07's cannot disagree on one run.
"""

from __future__ import annotations

from lab.engines.registry import BASELINE, BATCHING
from lab.experiments.ladder import clear, largest_clear
from lab.metrics.steps import FACTORS
from lab.metrics.steps_words import FACTOR_NAMES, larger
from lab.sweeps.words import overlap
from lab.words import POOLED, by_users, factor_words, gain_words, users_words
from lab.words.labels import kind

LINKS = {
    "cache": "a KV cache",
    "paging": "paging",
    "requests": "more requests at once",
    "tokens_per_step": "more tokens per step",
    "step": "the cost of a step",
}
WHAT = {  # a dominant factor, as the story names its cause
    "tokens_per_step": "batching and paging (more output tokens per step)",
    "s_per_step": "vLLM's cheaper step (less time per step)",
    "busy_fraction": "less idle time between steps (busy fraction)",
}
LINK_OF = {"tokens_per_step": "tokens_per_step", "s_per_step": "step", "busy_fraction": "step"}


def place(link: str, finding: str) -> str:
    """A notebook's closing sentence: its computed finding at its link of the story (one of LINKS)."""
    if link not in LINKS:
        raise ValueError(f"link {link!r}: choose one of {', '.join(LINKS)}")
    chain = " → ".join(f"**{words}**" if name == link else words for name, words in LINKS.items())
    return f"In the story ({chain}; vLLM / HF = tokens per step x time per step x busy fraction): {finding}"


def level_words(users: int, level: dict) -> str:
    """Which factor made one level's lead, with the other two beside it (measured)."""
    big = larger(level)
    if big is None:
        return (f"at {users_words(users)} ({level['product']:.2f}x, {POOLED}) no factor stood clear of its repeats' "
                "spread")
    rest = ", ".join(f"{FACTOR_NAMES[f]} {level['factors'][f]['value']:.2f}x" for f in FACTORS if f != big["name"])
    return (f"at {users_words(users)} the lead ({level['product']:.2f}x, {POOLED}) came mostly from "
            f"{WHAT[big['name']]}, {factor_words(big)} ({rest})")


def dominant(levels: list[tuple[int, dict]]) -> str:
    """Which factor dominates at which load, over levels fewest users first (measured)."""
    found = [(users, larger(level)) for users, level in levels]
    names = {big["name"] for _, big in found if big}
    if len(names) == 1 and all(big for _, big in found):
        return f"{WHAT[names.pop()]} made most of the lead {'at every load ' if len(found) > 1 else ''}here"
    return "; ".join(f"{WHAT[big['name']] if big else 'no clear factor'} at {users_words(users)}"
                     for users, big in found)


def _link(levels: list[tuple[int, dict]]) -> str:
    """The link of the busiest level's dominant factor (the cost of a step where none is clear)."""
    big = larger(levels[-1][1]) if levels else None
    return LINK_OF[big["name"]] if big else "step"


def lead_story(summary: dict) -> str:
    """Notebook 01: each level's lead taken apart, and which factor dominated at which load (summary.json's
    ``factors``)."""
    levels = [(int(u), level) for u, level in by_users(summary.get("factors") or {})]
    if not levels:
        return place("step", "the engines timed no steps here, so the lead could not be taken apart.")
    said = "; ".join(level_words(u, level) for u, level in levels)
    return place(_link(levels), f"{said}: {dominant(levels)}.")


def ladder_story(ladders: list[dict]) -> str:
    """Notebook 07: each ladder's load taken apart as 01 takes a level apart (its ``steps``) beside the ladder's
    largest step, then which factor dominated at which load: the ladder and 01-02 read on one device."""
    levels = sorted(((f["load"]["users"], f) for f in ladders if f.get("steps")), key=lambda kv: kv[0])
    if not levels:
        return place("step", "the ladders timed no steps, so their loads could not be taken apart.")
    parts = [f"with `{f['preset']}` {level_words(users, f['steps'])}; {_ladder_step(f)}" for users, f in levels]
    factors = [(users, f["steps"]) for users, f in levels]
    return place(_link(factors), "; ".join(parts) + f". So {dominant(factors)}{_batching_words(factors)}.")


def _ladder_step(fields: dict) -> str:
    """The ladder's largest step beside the factors of the same load: whether they point the same way, and why
    they can differ."""
    big = largest_clear(fields.get("factors") or [])
    if big is None:
        return "no step of its ladder stood clear of its repeats' spread"
    said = f"its ladder's largest step was {big['lower']} → {big['upper']} ({big['mechanism']}), {factor_words(big)}"
    batching = (big["lower"], big["upper"]) == (BASELINE, BATCHING)
    if batching == ((larger(fields["steps"]) or {}).get("name") == "tokens_per_step"):
        return said + ", the same way the factors point"
    return said + _rows_words(fields["steps"]) if batching else said + (
        ", though the factors find most of the lead in tokens per step: the ladder credits each rung's whole change "
        "to its mechanism, the factors split HF's steps against vLLM's")


def _rows_words(level: dict) -> str:
    """Why the ladder can credit batching while the factors credit the step: rows a step and a row's cost."""
    hf, vllm = (level["engines"][level[k]] for k in ("base", "top"))
    if not hf.get("rows") or not vllm.get("rows"):
        return ": the ladder credits the rung's whole change to batching, whose steps also cost differently"
    per_row = [e["s_per_step"] / e["rows"] * 1000 for e in (hf, vllm)]
    return (f": the ladder credits that rung's whole change to batching in transformers' own code, whose steps also "
            f"cost differently, while the factors set HF's step against vLLM's: HF's batch ran {hf['rows']:.1f} rows "
            f"a step for {hf['tokens_per_step']:.1f} useful tokens and vLLM's {vllm['rows']:.1f} for "
            f"{vllm['tokens_per_step']:.1f}, and a row's share of a step took {per_row[0]:.1f} ms in HF, "
            f"{per_row[1]:.1f} ms in vLLM (measured)")


def _batching_words(levels: list[tuple[int, dict]]) -> str:
    """Where batching and paging (01, 02) stand beside the step's cost on these loads (tokens per step, measured)."""
    if any((larger(level) or {}).get("name") == "tokens_per_step" for _, level in levels):
        return ": where more requests ran at once than HF's batches held, batching and paging led (01, 02)"
    gained = [(users, level["factors"]["tokens_per_step"]) for users, level in levels
              if clear(level["factors"]["tokens_per_step"]) and level["factors"]["tokens_per_step"]["value"] > 1]
    if gained:
        users, factor = gained[-1]
        return (f": batching and paging (01, 02) added {factor_words(factor)} tokens per step at "
                f"{users_words(users)}, less than the step's cost gave")
    return (": batching and paging (01, 02) add tokens per step only where a load holds more requests at once "
            "than HF's batches run, and these loads did not")


def paging_story(fields: dict, users: int) -> str:
    """Notebook 02: what the smaller block bought in requests at once, and whether this load needed them (the
    waste experiment's ``block_sizes``)."""
    rows = sorted((r for r in (fields.get("block_sizes") or {}).values() if r.get("requests_at_once")),
                  key=lambda r: r["block_size"])
    measured = [r for r in rows if kind(r["origin"]) == "measured"]
    if not measured:
        return place("paging", "vLLM held no blocks long enough here to say what they bought.")
    if len(measured) == 1:
        row = measured[0]
        return place("requests", f"vLLM ran in blocks of {row['block_size']} only, where a request held "
                                 f"{row['held_per_request']} KV slots on average, so the pool holds "
                                 f"{row['requests_at_once']} such requests at once (from the measured blocks); "
                                 f"{_pool_words(row, users)}")
    small, large = measured[0], measured[-1]
    said = (f"blocks of {small['block_size']} instead of {large['block_size']} let the same pool hold "
            f"{small['requests_at_once']} requests of this run at once instead of {large['requests_at_once']} "
            f"(from the measured blocks per request)")
    return place("requests", f"{said}; {_pool_words(large, users)}")


def _pool_words(row: dict, users: int) -> str:
    """Whether this load filled the pool: only then do more requests at once make more tokens per step."""
    peak, total = row.get("peak_used_blocks"), row.get("num_blocks")
    if not total:
        return "more requests at once make more tokens per step when users are there to fill them."
    if peak is not None and peak >= total:
        return (f"this run's {users_words(users)} filled all {total} blocks (measured), so there more room meant more "
                f"requests in each step, and more tokens per step.")
    return (f"but this run's {users_words(users)} used at most {peak} of its {total} blocks (measured): the pool was "
            f"not what limited requests at once here, so the room buys tokens per step only under a load of more "
            f"users than fit.")


def queue_story(first: dict, last: dict, users: str) -> str:
    """Notebook 04: what capping vLLM's requests a step did to its tok/s (a max_num_seqs sweep's smallest and
    largest values, measured)."""
    ratio = first[f"output_tok_s@{users}"] / last[f"output_tok_s@{users}"]
    said = (f"capped at max_num_seqs={first['value']}, vLLM made {ratio:.2f}x the output tok/s it made at "
            f"{last['value']} with {users} users (measured)")
    if overlap(first, last, users):
        return place("tokens_per_step", said + ", within the repeats' spread: here the cap did not cost tokens per "
                                              "step.")
    if ratio < 1:
        return place("tokens_per_step", said + ": fewer requests in a step made fewer tokens per step, the factor "
                                              "batching and paging buy.")
    return place("tokens_per_step", said + ": the cap cost nothing here; a step of one request was as productive.")


def concurrency_story(decode: dict, users: int, capacity: dict | None = None) -> str:
    """Notebook 03: what more requests at once bought vLLM's decode-bound tok/s (the phases gain from 1 user to
    ``users``, measured, judged on its repeats' spread) and, from its capacity search (capacity.json), in users
    served under the target (computed)."""
    vllm = decode["vllm"]
    spread = vllm.get("gain_spread")
    said = f"from 1 to {users_words(users)} vLLM's decode-bound tok/s {gain_words(vllm['gain'], spread)} (measured)"
    if spread and spread["n"] > 1 and not clear(spread):
        said += ": the extra requests at once made no measured difference to the tokens a step made here"
    elif vllm["gain"] > 1:
        said += ": the extra requests ran in the same steps, so each step made more tokens"
    else:
        said += ": the extra requests cost each step more than they added"
    return place("tokens_per_step", said + _capacity_words(capacity) + ".")


def _capacity_words(data: dict | None) -> str:
    """'; under ttft_p95 <= 2 s ... that came to at least 4x HF's users (computed ...)', or '' without a ratio."""
    ratio = ((data or {}).get("ratios") or {}).get("vllm/hf") or {}
    if ratio.get("value") is None:
        return ""
    from lab.capacity.targets import seconds_words

    bound = "at least " if ratio["bound"] == "at_least" else "at most " if ratio["bound"] == "at_most" else ""
    targets = " and ".join(f"{t['name']} <= {seconds_words(t['limit_s'])}" for t in data["targets"])
    return (f"; under {targets} that came to {bound}{ratio['value']:.2g}x HF's users served ({kind('arithmetic')} "
            f"from the search's measured probes)")


def prefix_story(fields: dict) -> str:
    """Notebook 05: what paging's blocks let prefix caching share (the constant-first order's hit rate, measured,
    beside the blocks the shared part fills, computed) and what it did to the first token (judged on the repeats'
    spread)."""
    first, last = fields["first"], fields["last"]
    if first["hit_rate"] is None or last["hit_rate"] is None or first["hit_rate"] <= last["hit_rate"]:
        return place("paging", "the constant-first order found no more of its prompts in the pool's blocks than the "
                               "constant-last one here, so no block was shared between requests.")
    blocks = first["computed"]["full_blocks"]
    said = (f"with the shared part first, {first['hit_rate']:.0%} of the prompt tokens were found in blocks already "
            f"in the pool (measured): the {blocks} full block{'s' * (blocks != 1)} of the shared part "
            f"({kind('formula')}) entered every later request's block table instead of being computed again")
    spread = fields.get("ttft_ratio_spread")
    if not spread or not fields.get("ttft_last_over_first"):
        return place("paging", said + ".")
    if spread["n"] > 1 and not clear(spread):
        return place("paging", said + ", though the first token came no measurably sooner (the TTFT repeats straddle "
                                      "1).")
    faster = fields["ttft_last_over_first"] > 1
    return place("paging", said + (f", and its time to first token was {fields['ttft_last_over_first']:.2f}x shorter "
                                   f"than the constant-last order's (measured)." if faster else
                                   ", yet the first token came no sooner here."))


def sharing_story(sharing: dict, n: int, preemption: dict) -> str:
    """Notebook 06: the blocks n answers to one prompt held against unshared copies (measured against computed),
    and what a pool too small for the load did to tok/s (measured)."""
    many, unshared = sharing[f"n={n} in one request"]["peak_blocks"], sharing["unshared_blocks_estimate"]
    said = (f"{n} answers to one prompt held {many} blocks at their peak (measured) against {unshared} for {n} "
            f"unshared copies ({kind('arithmetic')})")
    said += (": paging let them share the prompt's blocks, leaving room for more requests at once" if many < unshared
             else ": nothing was shared here, so they took as much room as separate requests")
    return place("requests", f"{said}; {_small_pool_words(preemption)}.")


def _small_pool_words(fields: dict) -> str:
    """Whether the small pool held every request at once (its waiting queue and preemptions) and its tok/s against
    the normal pool's (one run each, measured)."""
    small, normal = fields["small"], fields["normal"]
    if small["peak_waiting"] or small["preemptions"]:
        said = (f"a pool of {small['kv_blocks']} blocks could not hold every request at once (up to "
                f"{small['peak_waiting']} waiting, {small['preemptions']} preemption(s))")
    else:
        said = f"a pool of {small['kv_blocks']} blocks still held every request at once here (none waited)"
    if not normal["output_tok_s"]:
        return said + ", and the normal pool made no tokens to compare it with"
    said += (f" and made {small['output_tok_s'] / normal['output_tok_s']:.2f}x the normal pool's tok/s "
             f"(measured, one run each)")
    if normal.get("preemptions"):  # the load filled the normal pool too: preemption is not the small pool's alone
        said += (f", though the normal pool of {normal['kv_blocks']} blocks preempted too "
                 f"({normal['preemptions']} times)")
    return said
