"""cache: why a KV cache exists, measured on the session's HF model, and what it costs in memory.

Without the cache every new token recomputes the keys and values of the whole sequence so far, so a step costs
more the longer the sequence; with it a step computes one token's keys and values and reads the rest. The
experiment decodes one short prompt to several lengths both ways (greedy, exact lengths) and reports
milliseconds per output token (measured) and how many times it grew from the shortest decode to the
longest (``growth``, measured). Then the memory side: bytes per token from the model's config, with
grouped-query attention spelled out (computed), and the tokens vLLM's pool holds: the budget over the bytes per
token (computed) beside vLLM's own block count times its block size (measured at start-up).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from lab.engines.base import kv_bytes_per_token_formula
from lab.load.workloads import FIXED_PROMPT_BOUND, SEED_PROMPT

ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded
MAX_LENGTH = 512  # output tokens one decode may ask for: without a cache each step recomputes the whole past


@dataclass(frozen=True)
class Params:
    """lengths: output tokens decoded each way, with and without the cache, from the seeds' short prompt."""

    lengths: tuple[int, ...] = (16, 64, 256)

    def __post_init__(self) -> None:
        bad = [n for n in self.lengths if not 1 <= n <= MAX_LENGTH]
        if not self.lengths or bad:
            raise ValueError(f"lengths: give output lengths from 1 to {MAX_LENGTH} tokens, e.g. 16,64,128"
                             + (f", not {bad[0]}" if bad else ""))


def check(params: Params, config) -> None:
    """The longest decode must fit max_model_len."""
    if max(params.lengths) + FIXED_PROMPT_BOUND > config.max_model_len:
        raise ValueError(f"lengths: {max(params.lengths)} output tokens + the prompt's {FIXED_PROMPT_BOUND} pass "
                         f"max_model_len {config.max_model_len}: give at most "
                         f"{config.max_model_len - FIXED_PROMPT_BOUND}")


async def run(session, params: Params, result, notify) -> None:
    """Each length with the cache, then without; then the memory figures."""
    hf, prompt = session.engines["hf"], tuple(session.tokenizer.encode(SEED_PROMPT))
    result.series = {"with cache": [], "without cache": []}
    for length in params.lengths:
        for mode, use in (("with cache", True), ("without cache", False)):
            result.message = f"{length} tokens {mode}"
            notify(result)
            seconds = await asyncio.to_thread(hf.time_per_token, prompt, length, use)
            result.series[mode].append((length, round(seconds * 1000, 2)))
            result.rows.append({"mode": mode, "output_tokens": length, "ms_per_token": round(seconds * 1000, 2)})
    result.fields.update(memory_fields(session), ms_per_token=result.series)
    result.fields["growth"] = {mode: growth(result.fields, mode) for mode in result.series}
    notify(result)


def memory_fields(session) -> dict:
    """Bytes per token with its formula and GQA (computed); the pool in tokens, computed and as vLLM counted it."""
    from lab.memory import kv_budget_bytes

    config = session.model_config
    per_token, formula = kv_bytes_per_token_formula(config, session.config.resolved_dtype())
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    info, budget = session.info.get("vllm"), kv_budget_bytes(session.config)
    return {"bytes_per_token": per_token, "formula": formula, "query_heads": heads, "kv_heads": kv_heads,
            "pool_bytes": budget, "pool_tokens_computed": budget // per_token if budget else None,
            "pool_tokens_vllm": info.kv_total_blocks * info.kv_block_size if info and info.kv_total_blocks else None,
            "block_size": info.kv_block_size if info else None}


def growth(fields: dict, mode: str) -> float:
    """How many times a token's time grew from the shortest decode to the longest, one way (measured)."""
    points = fields["ms_per_token"][mode]
    return points[-1][1] / points[0][1]
