"""vLLM offline: LLM.generate over a list of requests at once, the ceiling the lab's served faces are set against.

No users, no streaming, no per-token hand-over: vLLM schedules every request itself and returns when the last
ends. Same engine args as the lab's vLLM (lab.engines.vllm.engine_kwargs), stats off as LLM has them by default,
token ids only. It speaks no Engine protocol: it measures one batch of requests (the why ladder's top rung).
"""

from __future__ import annotations

import asyncio
import time

from lab.config import EngineConfig
from lab.engines.base import GenRequest
from lab.engines.vllm import VLLMEngine, shut_down


class OfflineVLLM:
    """vLLM's LLM class over the lab's engine args."""

    name = "offline"

    def __init__(self, config: EngineConfig, model_path: str):
        self.config, self.model_path, self.llm, self.args = config, model_path, None, {}

    async def start(self) -> dict:
        """Start vLLM's LLM (its engine core in a process of its own); returns its engine args."""
        from vllm import LLM

        kwargs, _ = VLLMEngine(self.config, self.model_path)._prepare()  # the lab's args, environment, block rule
        kwargs["disable_log_stats"] = True

        self.llm = await asyncio.to_thread(LLM, **kwargs)
        self.args = {k: v for k, v in kwargs.items() if k != "model"} | {
            "batching": f"offline LLM.generate: every request queued at once, up to {kwargs['max_num_seqs']} running"}
        return self.args

    async def generate(self, requests: list[GenRequest]) -> tuple[int, float]:
        """Run every request at once, greedy, exact lengths: (output tokens, seconds)."""
        prompts, params = _inputs(requests)

        def run() -> tuple[int, float]:
            self.llm.reset_prefix_cache()
            began = time.perf_counter()
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outputs), time.perf_counter() - began

        return await asyncio.to_thread(run)

    async def stop(self) -> None:
        if self.llm is not None:
            llm, self.llm = self.llm, None
            await asyncio.to_thread(shut_down, llm.llm_engine.engine_core)


def _inputs(requests: list[GenRequest]) -> tuple[list, list]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return ([TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests],
            [SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos, temperature=0.0, detokenize=False)
             for r in requests])
