"""sharing: parallel sampling (n=4) of one prompt vs four separate requests with the same prompt.

With paged KV, the prompt's blocks can be shared by every answer drawn from it and only the answers'
own blocks differ (seed 003: block sharing, copy-on-write). The experiment measures vLLM's peak used
blocks (its own count) for one answer alone, for n answers in one request, and for n separate requests
sent at once, and tok/s for the last two. In this vLLM (v1) parallel sampling fans out into n requests
that share the prompt's blocks through the prefix cache, so n separate identical requests sent together
share them too; the saving is against n unshared copies of the prompt (n x one answer's blocks).
Beam search is not an engine feature here: vLLM implements it above the engine (LLM.beam_search and the
OpenAI server), so the lab's engine does not measure it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from lab.load.workloads import passage_ids
from lab.metrics.kv import used_blocks

ENGINES = ("vllm",)  # the engines this experiment needs loaded
BEAM_SEARCH = ("not measured: vLLM implements beam search above the engine (LLM.beam_search, the OpenAI "
               "server), not as an engine feature the lab's AsyncLLM path can drive")


@dataclass(frozen=True)
class Params:
    """n answers of output_len tokens to one prompt of prompt_tokens."""

    n: int = 4
    prompt_tokens: int = 512
    output_len: int = 64

    def __post_init__(self) -> None:
        for name in ("n", "prompt_tokens", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def check(params: Params, config) -> None:
    """The prompt and one answer must fit max_model_len."""
    total = params.prompt_tokens + params.output_len
    if total > config.max_model_len:
        raise ValueError(f"prompt_tokens + output_len = {total} tokens, past max_model_len {config.max_model_len}")


async def run(session, params: Params, result, notify) -> None:
    """One answer, then n in one request, then n separate requests: peak blocks and tok/s of each."""
    engine = session.engines["vllm"]
    prompt = tuple(passage_ids(session.tokenizer, params.prompt_tokens)[:params.prompt_tokens])
    variants = {"one": (1, 1), f"n={params.n} in one request": (params.n, 1),
                f"{params.n} separate requests": (1, params.n)}
    for name, (n, requests) in variants.items():
        result.message = f"{name}: {params.prompt_tokens}-token prompt, {params.output_len} tokens per answer"
        notify(result)
        result.fields[name] = await measure(engine, prompt, params.output_len, n, requests)
        notify(result)
    one = result.fields["one"]["peak_blocks"]
    result.fields["unshared_blocks_estimate"] = params.n * one
    result.fields["beam_search"] = BEAM_SEARCH
    result.rows = [{"variant": k, **v} for k, v in result.fields.items() if isinstance(v, dict)]


async def measure(engine, prompt, output_len: int, n: int, requests: int) -> dict:
    """Peak used blocks (vLLM's count) and output tok/s of ``requests`` requests of ``n`` answers each."""
    await engine.reset()
    engine.drain_samples()
    start = time.perf_counter()
    answers = await asyncio.gather(*(engine.sample(prompt, output_len, n, seed=i) for i in range(requests)))
    elapsed = time.perf_counter() - start
    samples = [s for s in engine.drain_samples() if s.kv_usage is not None]
    tokens = sum(len(a) for batch in answers for a in batch)
    return {"answers": sum(len(b) for b in answers), "output_tokens": tokens, "output_tok_s": tokens / elapsed,
            "peak_blocks": max((used_blocks(s) for s in samples), default=0),
            "prefix_hit_tokens": sum(s.prefix_hits for s in samples)}
