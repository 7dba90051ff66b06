"""vLLM's two faces and its ceiling, side by side in one run: offline LLM.generate, the lab's engine mode
(vllm-engine: LLMEngine.step() fed by closed-loop users), the lab's served mode (vllm: AsyncLLM streaming)
and a bare AsyncLLM client (N concurrent generate() streams, no lab code).

Same model, same prompts, same exact output lengths, greedy. The lab's modes send all requests at once
(users = requests), then run 20 closed-loop users over as many requests. Each engine is started, measured
and stopped in turn, so each may take the whole device.
Usage: python -m bench.lab_vs_offline_vllm [--requests 64] [--output-len 64] [--device cuda]
       [--model FOLDER] [--load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import time

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.runs import level_requests
from lab.session import LabSession

GOAL = 0.90  # engine mode / offline at all-at-once


def plans(args, engine: str) -> list[RunPlan]:
    """All requests at once (users = requests), then 20 closed-loop users over as many requests."""
    return [RunPlan(engines=(engine,), load=LoadConfig(
        users=(users,), requests_per_user=args.requests // users, workload=args.workload,
        output_len=args.output_len, warmup_requests=2)) for users in (args.requests, 20)]


async def lab_tok_s(config: EngineConfig, args, engine: str) -> list[tuple[int, float, list]]:
    """The lab's output tok/s per plan for one engine, with the exact requests each level sent."""
    session = LabSession(config, (engine,))
    await session.start()
    try:
        figures = []
        for plan in plans(args, engine):
            users = plan.load.users[0]
            result = await session.run(plan)
            requests = list(level_requests(session.tokenizer, plan, users))
            figures.append((users, result.levels[0].summary.output_tok_s, requests))
        return figures
    finally:
        await session.stop()


def wait_for_memory(config: EngineConfig, timeout_s: float = 60.0) -> None:
    """On a GPU, wait until the engine just stopped has given its memory back (its process exits a moment
    after shutdown returns): 90% of the card free, or timeout_s."""
    if config.resolved_device() != "cuda":
        return
    from lab.environment import read_device

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        device = read_device("cuda")
        if device.free_bytes >= 0.9 * device.total_bytes:
            return
        time.sleep(1)


def _prompts_and_params(requests, delta: bool = False):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
    return ([TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests],
            [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0, output_kind=kind,
                            detokenize=False) for r in requests])  # token ids only, as the lab asks


def offline_tok_s(config: EngineConfig, model_path: str, requests) -> float:
    """LLM.generate over every request at once (after a 2-request warm-up)."""
    from vllm import LLM

    from lab.engines.vllm import engine_kwargs

    kwargs = engine_kwargs(config, model_path)
    kwargs.pop("disable_log_stats", None)
    llm = LLM(**kwargs)
    prompts, params = _prompts_and_params(requests)
    llm.generate(prompts[:2], params[:2], use_tqdm=False)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return tokens / elapsed


async def bare_async_tok_s(config: EngineConfig, model_path: str, requests) -> float:
    """Every request as its own AsyncLLM.generate() stream (DELTA), all at once: no lab code at all."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from lab.engines.vllm import engine_kwargs

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(config, model_path)))
    prompts, params = _prompts_and_params(requests, delta=True)

    async def one(index: int, tag: str) -> int:
        made = 0
        async for output in engine.generate(prompts[index], params[index], f"{tag}-{index}"):
            made += len(output.outputs[0].token_ids)
        return made

    try:
        await asyncio.gather(one(0, "warm"), one(1, "warm"))
        await engine.reset_prefix_cache()
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i, "bare") for i in range(len(requests)))))
        return tokens / (time.perf_counter() - start)
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--model", default=None, help="a local HF folder (default: the embedded SmolLM2)")
    parser.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = EngineConfig(model=args.model, device=args.device, load_format=args.load_format)
    from lab.model import resolve_model

    model_path = resolve_model(args.model)
    from transformers import AutoTokenizer

    plan = plans(args, "vllm")[0]
    at_once = list(level_requests(AutoTokenizer.from_pretrained(model_path), plan, plan.load.users[0]))
    before = offline_tok_s(config, model_path, at_once)  # first and last: the machine's drift shows
    wait_for_memory(config)
    engine = asyncio.run(lab_tok_s(config, args, "vllm-engine"))
    wait_for_memory(config)
    served = asyncio.run(lab_tok_s(config, args, "vllm"))
    wait_for_memory(config)
    bare = asyncio.run(bare_async_tok_s(config, model_path, at_once))
    wait_for_memory(config)
    after = offline_tok_s(config, model_path, at_once)
    offline = (before + after) / 2
    print(f"\n{len(at_once)} requests, {args.workload}, {args.output_len} output tokens each, "
          f"{config.resolved_device()}, {model_path}")
    print(f"{'what':<58} {'output tok/s':>12} {'/ offline':>10}   (offline = mean of its two runs)")
    rows = [("offline LLM.generate, all at once (first run)", before),
            ("offline LLM.generate, all at once (last run)", after)]
    rows += [(f"lab vllm-engine (step loop), {users} closed-loop users", value) for users, value, _ in engine]
    rows += [(f"lab vllm (AsyncLLM streaming), {users} closed-loop users", value) for users, value, _ in served]
    rows += [(f"bare AsyncLLM client, {len(at_once)} concurrent streams", bare)]
    for what, value in rows:
        print(f"{what:<58} {value:>12.1f} {value / offline:>10.2f}")
    ratio = engine[0][1] / offline
    print(f"engine mode / offline at {len(at_once)} users: {ratio:.2f} (goal >= {GOAL}: "
          f"{'met' if ratio >= GOAL else 'NOT met'}); served / bare AsyncLLM: {served[0][1] / bare:.2f}")


if __name__ == "__main__":
    main()
