"""KV-cache figures from engine samples.

vLLM: usage = 1 - free_blocks / total_blocks, as vLLM's block pool defines it (read from its
SchedulerStats, never recomputed); used blocks = usage x total.
HF: reserved = bytes its static batch's contiguous cache holds (batch x padded length x bytes/token),
real = the part holding the requests' own prompt and output tokens; waste = 1 - real / reserved.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.engines.base import EngineSample


def used_blocks(sample: EngineSample) -> int | None:
    """vLLM blocks in use at the sample."""
    if sample.kv_usage is None or sample.kv_total_blocks is None:
        return None
    return round(sample.kv_usage * sample.kv_total_blocks)


def kv_summary(samples: Sequence[EngineSample], num_blocks: int | None = None,
               block_size: int | None = None) -> dict:
    """Peak KV figures of one engine over one level.

    Args:
        samples: The engine's samples during the level.
        num_blocks: vLLM's total KV blocks (from start-up), if known.
        block_size: Tokens per vLLM block.

    Returns:
        For vLLM: num_blocks, block_size, peak_usage, peak_used_blocks, preemptions, prefix-cache
        queries and hits during the level. For HF: peak_reserved_bytes, peak_real_bytes and
        waste_at_peak (share of the reserved cache not holding real tokens at the peak).
    """
    vllm = [s for s in samples if s.kv_usage is not None]
    if vllm or num_blocks is not None:
        peak = max((s.kv_usage for s in vllm), default=0.0)
        first, last = (vllm[0], vllm[-1]) if vllm else (None, None)
        return {
            "num_blocks": num_blocks, "block_size": block_size, "peak_usage": peak,
            "peak_used_blocks": round(peak * num_blocks) if num_blocks else None,
            "preemptions": (last.preemptions_total - first.preemptions_total) if vllm else 0,
            "prefix_cache_queries": (last.prefix_queries_total - first.prefix_queries_total) if vllm else 0,
            "prefix_cache_hits": (last.prefix_hits_total - first.prefix_hits_total) if vllm else 0,
        }
    hf = [s for s in samples if s.kv_reserved_bytes is not None]
    if not hf:
        return {}
    peak = max(hf, key=lambda s: s.kv_reserved_bytes)
    waste = 1 - peak.kv_real_bytes / peak.kv_reserved_bytes if peak.kv_reserved_bytes else 0.0
    return {
        "peak_reserved_bytes": peak.kv_reserved_bytes,
        "peak_real_bytes": max(s.kv_real_bytes for s in hf),
        "waste_at_peak": waste,
    }
