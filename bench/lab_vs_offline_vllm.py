"""Is the lab's vLLM figure vLLM's own? Lab (AsyncLLM + closed-loop users) vs offline LLM.generate.

Same model, same prompts, same exact output lengths, greedy; printed side by side as a ratio in one
run. The lab sends all requests at once (users = requests) so that both see the same queue, and also
at 20 users. Usage: python -m bench.lab_vs_offline_vllm [--requests 40] [--output-len 64]
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


def plans(args) -> list[RunPlan]:
    """All requests at once (users = requests), then 20 closed-loop users over as many requests."""
    return [RunPlan(engines=("vllm",), load=LoadConfig(
        users=(users,), requests_per_user=args.requests // users, workload=args.workload,
        output_len=args.output_len, warmup_requests=2)) for users in (args.requests, 20)]


async def lab_tok_s(config: EngineConfig, args) -> list[tuple[int, float, list]]:
    """The lab's vLLM output tok/s per plan, with the exact requests each level sent."""
    session = LabSession(config, ("vllm",))
    await session.start()
    try:
        figures = []
        for plan in plans(args):
            users = plan.load.users[0]
            result = await session.run(plan)
            requests = list(level_requests(session.tokenizer, plan, users))
            figures.append((users, result.levels[0].summary.output_tok_s, requests))
        return figures
    finally:
        await session.stop()


def offline_tok_s(config: EngineConfig, model_path: str, requests) -> float:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lab.engines.vllm import engine_kwargs

    kwargs = engine_kwargs(config, model_path)
    kwargs.pop("disable_log_stats", None)
    llm = LLM(**kwargs)
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0) for r in requests]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up, like the lab's
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    del llm
    gc.collect()
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--workload", default="mixed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = EngineConfig()
    lab = asyncio.run(lab_tok_s(config, args))
    time.sleep(2)
    from lab.model import resolve_model

    offline = offline_tok_s(config, resolve_model(None), [r for _, _, reqs in lab for r in reqs])
    print(f"\nvLLM offline LLM.generate, all {sum(len(r) for _, _, r in lab)} requests at once: "
          f"{offline:8.1f} output tok/s")
    for users, value, requests in lab:
        print(f"lab vLLM, {users:>3} closed-loop users, {len(requests)} requests: {value:8.1f} output tok/s"
              f"   lab/offline = {value / offline:.2f}")


if __name__ == "__main__":
    main()
