"""The memory plan in words (notebook 06): the planner's arithmetic, how many full-length requests fit (computed),
and what vLLM's KV budget is a share of on the device.
"""

from __future__ import annotations

from lab.environment import gib
from lab.metrics.kv import blocks_for


def plan_answer(fields: dict, device: str) -> list[str]:
    """The memory plan's arithmetic (computed), how many full-length requests fit, and what the budget is a share
    of on this device."""
    return plan_lines(fields) + ([] if fields.get("refused") else [budget_line(device)])


def plan_lines(fields: dict) -> list[str]:
    """The memory plan's arithmetic and how many full-length requests fit (computed), or the planner's refusal."""
    if fields.get("refused"):
        return [f"vLLM would refuse this setting (computed): {fields['reason']}"]
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
