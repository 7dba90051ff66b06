"""vLLM's real block table: the physical KV block ids each request holds, read from vLLM's own KV cache manager.

The served engines run vLLM's engine core in a process of its own, where its block table cannot be read. This
module runs one in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) in a child process of its own, so
that the setting and vLLM's environment cache never reach the lab's other engines. Closed-loop users feed it
step by step; after every step it records each running request's block ids (``get_block_ids``) and the tokens
whose KV they hold, the blocks more than one request holds (reference count > 1, prefix caching's sharing) and
the pool's free-block count. The parent gets the steps, and the engine args this engine ran with, as JSON.

    python -m lab.engines.vllm_blocks < spec.json > steps.json
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys

from lab.config import EngineConfig
from lab.engines.base import GenRequest


async def block_tables(config: EngineConfig, model_path: str, requests: list[GenRequest], users: int) -> dict:
    """Run ``requests`` through ``users`` closed-loop users on an in-process vLLM in a child process; returns
    {"steps": [{"step", "tables": {request: [block ids]}, "tokens": {request: tokens with KV}, "shared": {block:
    refs}, "free": free blocks}], "num_blocks", "block_size", "engine_args"}."""
    spec = {"config": {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "endpoints"},
            "model_path": model_path, "users": users,
            "requests": [[r.request_id, list(r.prompt_token_ids), r.max_tokens] for r in requests]}
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "lab.engines.vllm_blocks",
                                                 stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE)
    out, err = await child.communicate(json.dumps(spec).encode())
    if child.returncode:
        raise RuntimeError(f"vLLM's block-table process failed: {err.decode(errors='replace')[-800:]}")
    return json.loads(out)


def record(spec: dict) -> dict:
    """The child's work: start the in-process engine, feed the users, read the block table after each step."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"  # stdout carries the result alone
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from lab.engines.vllm import VLLMEngine, engine_args

    kwargs, _, attention = VLLMEngine(EngineConfig(**spec["config"]), spec["model_path"])._prepare()
    engine = LLMEngine.from_engine_args(engine_args(EngineArgs, {**kwargs, "disable_log_stats": True}))
    scheduler = engine.engine_core.engine_core.scheduler
    waiting, running, steps = list(spec["requests"]), set(), []
    bound = sum(tokens for *_, tokens in waiting) + 50 * len(waiting)  # steps enough for every token, and more
    while (waiting or running) and len(steps) < bound:
        while waiting and len(running) < spec["users"]:  # a free user sends its next request
            running.add(_add(engine, *waiting.pop(0)))
        for output in engine.step():
            if output.finished:
                running.discard(output.request_id.rsplit("-", 1)[0])
                running.discard(output.request_id)
        steps.append(snapshot(len(steps), scheduler))
    cache = engine.vllm_config.cache_config
    return {"steps": steps, "num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
            "engine_args": own_args(kwargs, engine.vllm_config, attention)}


def own_args(kwargs: dict, vllm_config, attention: str) -> dict:
    """The args this engine ran with (not the session's served vLLM's): its pool and block size as vLLM took them."""
    import vllm

    args = {k: v for k, v in kwargs.items() if k != "model"}
    args.update(num_kv_blocks=vllm_config.cache_config.num_gpu_blocks, block_size=vllm_config.cache_config.block_size,
                max_num_seqs=vllm_config.scheduler_config.max_num_seqs, cpu_attention=attention,
                engine="in-process LLMEngine (engine core in this child process), stepped one step at a time",
                vllm_version=vllm.__version__)
    return args


def _add(engine, request_id: str, prompt: list[int], tokens: int) -> str:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt),
                       SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, detokenize=False))
    return request_id


def snapshot(step: int, scheduler) -> dict:
    """Each request's block ids after a step (vLLM suffixes the lab's request ids), the tokens whose KV they hold,
    the shared blocks' reference counts and the pool's free blocks, all as vLLM's scheduler holds them."""
    manager = scheduler.kv_cache_manager
    held = {rid: list(manager.get_block_ids(rid)[0]) for rid in scheduler.requests}
    held = {rid: ids for rid, ids in held.items() if ids}
    refs = {b: manager.block_pool.blocks[b].ref_cnt for ids in held.values() for b in ids}
    return {"step": step, "tables": {rid.rsplit("-", 1)[0]: ids for rid, ids in held.items()},
            "tokens": {rid.rsplit("-", 1)[0]: scheduler.requests[rid].num_computed_tokens for rid in held},
            "shared": {b: n for b, n in refs.items() if n > 1}, "free": manager.block_pool.get_num_free_blocks()}


if __name__ == "__main__":
    result = record(json.loads(sys.stdin.read()))
    sys.stdout.write(json.dumps(result, default=str))
