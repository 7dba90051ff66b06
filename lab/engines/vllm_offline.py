"""vLLM offline: every request queued at once and LLMEngine stepped until none is left, as LLM.generate does;
the ceiling the lab's served faces are set against.

No users, no streaming, no per-token hand-over: vLLM schedules every request itself and returns when the last
ends. Same engine args as the lab's vLLM (lab.engines.vllm.engine_kwargs, its executor too: LLM would build its
own args, and on 2 CPU cores a different executor; its step caps too: `vllm serve`'s, not the LLM class's own
defaults), stats off as LLM has them, final outputs only, token ids only.
It speaks no Engine protocol: it measures one batch of requests (the why ladder's top rung).
"""

from __future__ import annotations

import asyncio
import time

from lab.config import EngineConfig
from lab.engines.base import GenRequest
from lab.engines.vllm import VLLMEngine, engine_args, shut_down


class OfflineVLLM:
    """vLLM's LLMEngine over the lab's engine args, driven as LLM.generate drives it."""

    name = "offline"

    def __init__(self, config: EngineConfig, model_path: str):
        self.config, self.model_path, self.engine, self.args = config, model_path, None, {}

    async def start(self) -> dict:
        """Start vLLM's LLMEngine (its engine core in a process of its own); returns its engine args."""
        kwargs, sources, _ = VLLMEngine(self.config, self.model_path)._prepare()  # args, environment, block rule
        kwargs["disable_log_stats"] = True

        self.engine = await asyncio.to_thread(offline_engine, kwargs)
        self.args = {k: v for k, v in kwargs.items() if k != "model"} | {
            "batching": f"offline LLM.generate: every request queued at once, up to {kwargs['max_num_seqs']} running",
            "source": sources}  # its step caps and pool sized as the served face's are
        return self.args

    async def generate(self, requests: list[GenRequest]) -> tuple[int, float]:
        """Run every request at once, greedy, exact lengths: (output tokens, seconds)."""
        prompts, params = _inputs(requests)

        return await asyncio.to_thread(generate_all, self.engine, prompts, params)

    async def stop(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(shut_down, engine.engine_core)


def offline_engine(kwargs: dict):
    """vLLM's LLMEngine on the lab's engine args, its executor kept (lab.engines.vllm.engine_args)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(engine_args(EngineArgs, kwargs))


def generate_all(engine, prompts: list, params: list) -> tuple[int, float]:
    """Queue every prompt in a fresh prefix cache and step until none is left, as LLM.generate does: (output tokens,
    seconds)."""
    engine.reset_prefix_cache()
    began, tokens = time.perf_counter(), 0
    for index, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"offline-{index}", prompt, param)
    while engine.has_unfinished_requests():
        tokens += sum(len(out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return tokens, time.perf_counter() - began


def _inputs(requests: list[GenRequest]) -> tuple[list, list]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    return ([TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests],
            [SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos, temperature=0.0, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
             for r in requests])
