"""prefix: the same requests with a long constant block first vs last in the prompt (seed 000's gotcha).

vLLM's prefix cache matches whole blocks from the start of a prompt: a constant system block placed
first is computed once and found by every later request; placed last, each request's own text comes
first and nothing matches. Between the two orders the prefix cache is reset; with repeats the orders take
turns. Hit rate and the number of prompt tokens looked up come from vLLM's own per-step prefix-cache counters;
beside them, the hits the block rule predicts (computed: every request after the first finds the shared part's
full blocks).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from lab.config import MAX_REPEATS
from lab.engines.base import GenRequest
from lab.load.driver import run_users
from lab.load.workloads import passage_ids
from lab.metrics import percentile, ttft_s
from lab.status import RequestStatus

ENGINES = ("vllm",)  # the engines this experiment needs loaded
ORDERS = ("first", "last")


@dataclass(frozen=True)
class Params:
    """requests: how many (the same set in both orders); users: concurrent closed-loop users sending them;
    shared_tokens: the constant block; unique_tokens: each request's own part; output_len per request; repeats:
    turns of both orders (TTFT's ratio gets a spread)."""

    requests: int = 8
    users: int = 2
    shared_tokens: int = 384
    unique_tokens: int = 48
    output_len: int = 8
    repeats: int = 1

    def __post_init__(self) -> None:
        for name in ("requests", "users", "shared_tokens", "unique_tokens", "output_len", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.repeats > MAX_REPEATS:
            raise ValueError(f"repeats must be at most {MAX_REPEATS}, not {self.repeats}")


def block_rule_hits(params: Params, order: str, block_size: int) -> dict:
    """The prefix-cache hits of one turn that vLLM's rule predicts (computed): with the shared part first, every
    request after the first finds its full blocks; with it last, a prompt's first block holds its own tokens: none."""
    full = params.shared_tokens // block_size * block_size if order == "first" else 0
    hits = (params.requests - 1) * full
    return {"hit_tokens": hits, "hit_rate": hits / (params.requests * (params.shared_tokens + params.unique_tokens)),
            "full_blocks": full // block_size}


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
    """Both orders on vLLM, ``repeats`` times in turn, the prefix cache reset before each; then the figures."""
    engine, turns = session.engines["vllm"], {order: [] for order in ORDERS}
    for repeat in range(params.repeats):
        for order in ORDERS if repeat % 2 == 0 else ORDERS[::-1]:  # odd repeats backwards: drift favours neither
            result.message = f"repeat {repeat + 1}: constant block {order}, {params.requests} requests"
            notify(result)
            turns[order].append(await _turn(session, engine, params, order, repeat, result))
    block = session.info["vllm"].kv_block_size
    for order in ORDERS:
        result.fields[order] = _order_fields(turns[order]) | {"computed": block_rule_hits(params, order, block)}
    ratios = [b["ttft_p50_s"] / a["ttft_p50_s"] for a, b in zip(turns["first"], turns["last"], strict=True)
              if a["ttft_p50_s"] and b["ttft_p50_s"]]
    first, last = result.fields["first"]["ttft_p50_s"], result.fields["last"]["ttft_p50_s"]
    if ratios and first and last:  # the ratio of the two medians shown; the paired repeats give its spread
        result.fields["ttft_last_over_first"] = last / first
        result.fields["ttft_ratio_spread"] = {"low": min(ratios), "high": max(ratios), "n": len(ratios)}
    result.fields["block_size"] = block
    notify(result)


async def _turn(session, engine, params: Params, order: str, repeat: int, result) -> dict:
    """One order's requests from an empty prefix cache: vLLM's hit counts and the TTFTs."""
    await engine.reset()
    engine.drain_samples()
    records = await run_users(engine, iter(build_requests(session.tokenizer, params, order)), params.users)
    samples = engine.drain_samples()
    ttfts = [t for r in records if (t := ttft_s(r)) is not None]
    result.rows += [{"order": order, "repeat": repeat, "request_id": r.request_id, "prompt_tokens": r.prompt_tokens,
                     "ttft_s": ttft_s(r), "status": r.status} for r in records]
    return {"queries": sum(s.prefix_queries for s in samples), "hits": sum(s.prefix_hits for s in samples),
            "ttft_p50_s": percentile(ttfts, 50), "errors": sum(1 for r in records if r.status != RequestStatus.OK)}


def _order_fields(turns: list[dict]) -> dict:
    """One order over its repeats: hit rate over every lookup (measured), the median of the TTFT p50s."""
    queries, hits = sum(t["queries"] for t in turns), sum(t["hits"] for t in turns)
    ttfts = [t["ttft_p50_s"] for t in turns if t["ttft_p50_s"] is not None]
    return {"hit_rate": hits / queries if queries else None, "queried_tokens": queries, "hit_tokens": hits,
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None, "errors": sum(t["errors"] for t in turns)}
