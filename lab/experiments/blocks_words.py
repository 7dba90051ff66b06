"""The blocks experiment in words (notebook 02): the block count derived from token counts against vLLM's own at
every step, how far apart and why where they parted (measured).
"""

from __future__ import annotations

from lab.experiments.waste import PAPER_BLOCK
from lab.metrics.kv import blocks_for, empty_slots


def blocks_needed_lines(tokens: int, requests: int, block_size: int) -> list[str]:
    """Blocks that ``requests`` requests of ``tokens`` tokens need in the vLLM paper's blocks of 16 and in this
    engine's (computed); one figure where the engine's blocks are the paper's size already (a GPU's default)."""
    each = (f"Each request needs ceil({tokens} / {PAPER_BLOCK}) = {blocks_for(tokens, PAPER_BLOCK)} blocks of "
            f"{PAPER_BLOCK} ({empty_slots(tokens, PAPER_BLOCK)} slots empty in its last one)")
    why = "Small blocks waste less; large blocks mean fewer, bigger copies and shorter block tables."
    if block_size == PAPER_BLOCK:
        return [f"{each}. This engine's blocks hold {PAPER_BLOCK} tokens already, the vLLM paper's size (vLLM's "
                f"default on a GPU), so {blocks_for(tokens, block_size, requests)} blocks is its count too "
                f"(computed).", why]
    return [f"At this engine's block size, {block_size}: {blocks_for(tokens, block_size, requests)} blocks "
            f"(computed).", f"{each}; in blocks of {block_size} it needs {blocks_for(tokens, block_size)} "
            f"({empty_slots(tokens, block_size)} empty).", why]


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
    if fields["vllm_ahead"] and fields["agree"] is False:
        return [said, "At the widest gap vLLM counted more, by more than one block per running request: a block "
                "allocated one step early cannot explain that much. The derived count sees a request only from its "
                "first token's arrival, so it misses the prompt blocks vLLM already holds for a request whose first "
                "token has not reached the lab yet; on a fast device that can take several engine steps, which this "
                "run does not measure apart."]
    if fields["vllm_ahead"]:
        why = ("vLLM counted more: it allocates a request's next block when it schedules the step that writes the "
               "block's first token, and the derived count sees that token only when it arrives, one step later")
    else:
        why = ("the derived count counted more: it still held a request's blocks after vLLM had freed them, since a "
               "request's end reaches the client after the step that finished it")
    several = "; several requests crossed a block boundary in the same step" * (fields["max_abs_diff_blocks"] > 1)
    return [said, f"At the widest gap {why}{several}."]
