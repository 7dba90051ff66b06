"""preemption: a deliberately small KV pool under many users, against the session's normal pool.

When the running requests need more blocks than are free, vLLM's scheduler preempts the newest one:
in this vLLM (v1) it frees that request's blocks and recomputes its prompt and output so far when it is
scheduled again (no swapping to CPU memory). The experiment starts a second vLLM engine with
``kv_blocks`` blocks (vLLM's num_gpu_blocks_override), sends the same requests to it and to the
session's vLLM, and counts preemptions with vLLM's own counter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from lab.config import LoadConfig
from lab.engines import create_engine
from lab.load.driver import run_users
from lab.load.workloads import longest_request, make_requests
from lab.memory import least_blocks
from lab.metrics import summarize

MODE = ("recompute: vLLM v1 frees a preempted request's blocks and recomputes its prompt and output so "
        "far when it is scheduled again (no swapping to CPU memory in this version)")


ENGINES = ("vllm",)  # the engines this experiment needs loaded


@dataclass(frozen=True)
class Params:
    """kv_blocks: the small pool (None: the least vLLM accepts, one max_model_len request plus its null
    block); users, requests_per_user, workload and output_len of the load."""

    kv_blocks: int | None = None
    users: int = 20
    requests_per_user: int = 1
    workload: str = "mixed"
    output_len: int | None = 64

    def __post_init__(self) -> None:
        LoadConfig(users=(self.users,), workload=self.workload, requests_per_user=self.requests_per_user,
                   output_len=self.output_len)
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError(f"kv_blocks must be at least 1, not {self.kv_blocks}")

    def pool_blocks(self, config) -> int:
        """The small pool's blocks for this engine config."""
        return self.kv_blocks or least_blocks(config)

    def check_pool(self, config) -> None:
        """Refuse a pool too small to hold even one request: vLLM wants one of max_model_len tokens."""
        need = least_blocks(config)
        if self.kv_blocks is not None and self.kv_blocks < need:
            raise ValueError(f"kv_blocks={self.kv_blocks} cannot hold even one request: vLLM needs room for one "
                             f"request of max_model_len {config.max_model_len} tokens, {need} blocks of "
                             f"{config.resolved_block_size()} (one is its null block)")


def check(params: Params, config) -> None:
    """The small pool must hold one request at its longest; the requests must fit max_model_len."""
    params.check_pool(config)
    prompt, output = longest_request(params.workload, params.output_len)
    if prompt + output > config.max_model_len:
        raise ValueError(f"output_len {output}: the {params.workload!r} workload's longest request ({prompt} + "
                         f"{output} tokens) is past max_model_len {config.max_model_len}: give output_len at most "
                         f"{max(1, config.max_model_len - prompt)}")


async def run(session, params: Params, result, notify) -> None:
    """The small pool first (a second engine, started and stopped here), then the session's pool."""
    requests = make_requests(session.tokenizer, params.workload, params.users * params.requests_per_user, 5,
                             params.output_len, prefix="preempt")
    blocks = params.pool_blocks(session.config)
    small_config = session.config.with_overrides(num_kv_blocks=blocks)
    result.message = f"starting a second vLLM with {blocks} KV blocks (about 30 s on a 2-core CPU)"
    notify(result)
    small = create_engine("vllm", small_config, session.check.model_path)
    started = time.perf_counter()
    info = await small.start()
    try:
        result.fields["small"] = await measure(small, info.kv_total_blocks, requests, params.users, result, notify)
        result.fields["small"]["start_s"] = time.perf_counter() - started
    finally:
        await small.stop()
    normal = session.engines["vllm"]
    result.fields["normal"] = await measure(normal, session.info["vllm"].kv_total_blocks, requests, params.users,
                                            result, notify)
    result.fields["preemption_mode"] = MODE


async def measure(engine, blocks: int, requests, users: int, result, notify) -> dict:
    """Send the requests to one engine; its preemptions, waiting queue and tok/s."""
    result.message = f"{users} users on a pool of {blocks} blocks"
    notify(result)
    await engine.reset()
    engine.drain_samples()
    records = await run_users(engine, iter(requests), users)
    samples = [s for s in engine.drain_samples() if s.kv_usage is not None]
    summary = summarize(records, engine.name, users)
    origin = min(r.send_s for r in records)
    series = [(s.time_s - origin, s.waiting, s.preemptions_total - samples[0].preemptions_total, s.kv_usage)
              for s in samples]
    result.series[f"{blocks} blocks"] = series
    result.rows += [{"pool_blocks": blocks, "time_s": round(t, 4), "waiting": w, "preemptions": p,
                     "kv_usage": u} for t, w, p, u in series]
    return {"kv_blocks": blocks, "preemptions": series[-1][2] if series else 0,
            "output_tok_s": summary.output_tok_s, "completed": summary.completed, "errors": summary.errors,
            "peak_waiting": max((s.waiting for s in samples), default=0),
            "mean_running": round(statistics.fmean(s.running for s in samples), 1) if samples else None,  # per step
            "peak_kv_usage": max((s.kv_usage for s in samples), default=0.0)}
