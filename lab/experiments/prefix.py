"""prefix: the same requests with a long constant block first vs last in the prompt (seed 000's gotcha).

vLLM's prefix cache matches whole blocks from the start of a prompt: a constant system block placed
first is computed once and found by every later request; placed last, each request's own text comes
first and nothing matches. Between the two orders the prefix cache is reset. Hit rate and the number of
prompt tokens looked up come from vLLM's own per-step prefix-cache counters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lab.engines.base import GenRequest
from lab.load.driver import run_users
from lab.load.workloads import passage_ids
from lab.metrics import percentile, ttft_s
from lab.status import RequestStatus

ENGINES = ("vllm",)  # the engines this experiment needs loaded

@dataclass(frozen=True)
class Params:
    """requests: how many (the same set in both orders); users: concurrent closed-loop users sending them;
    shared_tokens: the constant block; unique_tokens: each request's own part; output_len per request."""

    requests: int = 8
    users: int = 2
    shared_tokens: int = 384
    unique_tokens: int = 48
    output_len: int = 8

    def __post_init__(self) -> None:
        for name in ("requests", "users", "shared_tokens", "unique_tokens", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def build_requests(tokenizer, params: Params, order: str) -> list[GenRequest]:
    """Requests of ``order`` 'first' (constant + own part) or 'last' (own part + constant)."""
    source = passage_ids(tokenizer, params.shared_tokens + params.unique_tokens * (params.requests + 2))
    shared = source[:params.shared_tokens]
    rng = random.Random(7)
    starts = rng.sample(range(1, len(source) - params.unique_tokens), params.requests)
    requests = []
    for i, start in enumerate(starts):
        own = source[start:start + params.unique_tokens]
        prompt = shared + own if order == "first" else own + shared
        requests.append(GenRequest(f"prefix-{order}-{i}", tuple(prompt), params.output_len))
    return requests


def check(params: Params, config) -> None:
    """Prefix caching must be on, and a whole prompt plus its answer must fit max_model_len."""
    if not config.enable_prefix_caching:
        raise ValueError("prefix caching is off in this session (enable_prefix_caching=False)")
    longest = params.shared_tokens + params.unique_tokens + params.output_len
    if longest > config.max_model_len:
        raise ValueError(f"shared_tokens + unique_tokens + output_len = {longest} tokens, past max_model_len "
                         f"{config.max_model_len}")


async def run(session, params: Params, result, notify) -> None:
    """Both orders on vLLM, the prefix cache reset before each."""
    engine = session.engines["vllm"]
    for order in ("first", "last"):
        result.message = f"constant block {order}: {params.requests} requests, {params.users} users"
        notify(result)
        await engine.reset()
        engine.drain_samples()
        records = await run_users(engine, iter(build_requests(session.tokenizer, params, order)), params.users)
        samples = engine.drain_samples()
        queries, hits = sum(s.prefix_queries for s in samples), sum(s.prefix_hits for s in samples)
        ttfts = [t for r in records if (t := ttft_s(r)) is not None]
        result.fields[order] = {"hit_rate": hits / queries if queries else None, "queried_tokens": queries,
                                "hit_tokens": hits, "ttft_p50_s": percentile(ttfts, 50),
                                "errors": sum(1 for r in records if r.status != RequestStatus.OK)}
        result.rows += [{"order": order, "request_id": r.request_id, "prompt_tokens": r.prompt_tokens,
                         "ttft_s": ttft_s(r), "status": r.status} for r in records]
        notify(result)
    first, last = result.fields["first"], result.fields["last"]
    if first["ttft_p50_s"] and last["ttft_p50_s"]:
        result.fields["ttft_last_over_first"] = last["ttft_p50_s"] / first["ttft_p50_s"]
