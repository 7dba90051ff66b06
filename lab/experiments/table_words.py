"""The block-table experiment in words (notebook 02, the KV experiments tab): what vLLM's real block ids showed
over a run (how many at once, scattered tables, reuse, sharing) and after one step (measured: read from vLLM).
"""

from __future__ import annotations

from lab.words.labels import kind


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
