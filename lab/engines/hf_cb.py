"""The third contender: transformers' own continuous batching (paged KV), behind the async Engine protocol.

transformers 5.x serves requests from one background thread (``ContinuousBatchingManager``): a paged KV
cache of ``num_blocks`` blocks of ``page_size`` tokens, a scheduler that admits waiting requests at every
step, and per-request streaming. The lab loads its own copy of the model for it (the manager switches the
model's attention to its paged kernels), sizes its cache with the same KV budget as vLLM's on CPU, reads
KV usage as 1 - free/total (the cache's own free capacity, as vLLM's statistic is defined), and stamps
each token as its result reaches the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time

from lab.config import EngineConfig
from lab.engines import registry
from lab.engines.base import (
    EngineInfo,
    EngineSample,
    GenRequest,
    LocalEngine,
    RequestRejected,
    TokenChunk,
    kv_bytes_per_token,
)
from lab.memory import kv_budget_bytes

log = logging.getLogger(__name__)
PAGE_SIZE = 256  # tokens per KV block: transformers' default page size
BATCH_TOKENS = registry.ENGINES["hf-cb"].step_tokens  # tokens one step may hold (a prefill chunk plus decodes); left
# unset, transformers sizes it from free memory (46,542 on an H100), and its SDPA path keeps a mask of that x (cache +
# that) tokens: 36 GiB. Its registry entry holds the number: the memory plan sizes that mask from it
SAMPLE_EVERY_S = 0.05  # the manager has no per-step hook the lab can use: its counts are read 20 times a second
WARM_UP_GRAPHS = True  # on CUDA, capture its CUDA graphs before the first level (bench.hf_cb_settings turns it off)


def page_field(config_class) -> str:
    """The name of the tokens-per-block setting: page_size since transformers 5.18, block_size before."""
    return "page_size" if "page_size" in inspect.signature(config_class).parameters else "block_size"


def page_size(config: EngineConfig) -> int:
    """Tokens per page: the config's hf_cb_page_size, else transformers' default."""
    return config.hf_cb_page_size or PAGE_SIZE


def pool_blocks(config: EngineConfig, per_token: int) -> int | None:
    """Pages the budget holds (None: transformers' own sizing)."""
    budget = kv_budget_bytes(config)
    return None if budget is None else max(1, budget // (page_size(config) * per_token))


class HFCBEngine(LocalEngine):
    """transformers' ContinuousBatchingManager: paged KV, requests admitted at every step."""

    name = "hf-cb"

    def __init__(self, config: EngineConfig, model_path: str):
        super().__init__(config, model_path)
        self._manager = None
        self._ids = itertools.count()
        self._in_flight: set[str] = set()
        self._sampler: asyncio.Task | None = None

    async def start(self) -> EngineInfo:
        self.info = await asyncio.to_thread(self._load)
        self._manager.start()
        self._sampler = asyncio.ensure_future(self._sample_loop())
        return self.info

    def _load(self) -> EngineInfo:
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        from lab.engines.hf import load_model

        loaded = load_model(self.config, self.model_path)
        self.tokenizer, model = loaded.tokenizer, loaded.model
        per_token = kv_bytes_per_token(model.config, self.config.resolved_dtype())
        budget = kv_budget_bytes(self.config)
        settings = {page_field(ContinuousBatchingConfig): page_size(self.config), "allow_block_sharing": False,
                    "max_batch_tokens": BATCH_TOKENS}
        if budget is not None:
            settings["num_blocks"] = pool_blocks(self.config, per_token)
        if loaded.device == "cuda" and self.config.hf_cb_cuda_graphs:
            settings["use_cuda_graph"] = True  # measured on an H100: 1,596 vs 673-757 tok/s at 64 requests
        generation = GenerationConfig(do_sample=False, max_new_tokens=self.config.max_model_len,
                                      eos_token_id=model.generation_config.eos_token_id,
                                      pad_token_id=self.tokenizer.pad_token_id)
        self._manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=ContinuousBatchingConfig(**settings))
        settings["graphs_captured_at_start"] = self._capture_graphs(loaded.device)
        args = {"batching": "continuous (transformers ContinuousBatchingManager, paged KV)", **settings,
                "dtype": self.config.resolved_dtype(), "device": loaded.device,
                "max_model_len": self.config.max_model_len,
                "decoding": "greedy", "load_format": self.config.load_format,
                "kv_cache_bytes": budget if budget is not None else "transformers' own (share of free memory)"}
        memory = sum(p.numel() * p.element_size() for p in model.parameters())
        return EngineInfo(name=self.name, args=args, kv_bytes_per_token=per_token, memory_bytes=memory,
                          kv_block_size=page_size(self.config), kv_total_blocks=settings.get("num_blocks"),
                          attention=f"paged ({loaded.attention})")

    def _capture_graphs(self, device: str) -> bool:
        """Capture the CUDA graphs at their largest sizes now, as transformers' generate_batch does, rather than
        in the first measured levels (its manager's warmup(); a transformers without one captures them as it goes)."""
        warmup = getattr(self._manager, "warmup", None)
        if device != "cuda" or not WARM_UP_GRAPHS or warmup is None or not self.config.hf_cb_cuda_graphs:
            return False
        warmup()
        return True

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._manager is not None:
            manager, self._manager = self._manager, None
            await asyncio.to_thread(manager.stop, True, 10)

    async def reset(self) -> None:
        """Nothing to forget: block sharing (its prefix cache) is off, so each level starts from empty blocks."""

    async def abort_all(self) -> None:
        for request_id in list(self._in_flight):
            self._manager.cancel_request(request_id)

    def alive(self) -> bool:
        return self._manager is not None and self._manager.is_running() and self._fatal() is None

    def fault(self) -> str | None:
        if self._manager is None:
            return "HF continuous batching is not started"
        fatal = self._fatal()
        if fatal is not None:
            from lab.engines.failures import failure_words

            return failure_words("HF-CB", fatal, self.config.resolved_device(), len(self._in_flight))
        return None if self._manager.is_running() else "HF continuous batching's thread stopped"

    def _fatal(self) -> BaseException | None:
        return getattr(getattr(self._manager, "background_thread_status", None), "fatal_error", None)

    async def stream(self, request: GenRequest):
        """Queue the request in the manager and yield its new tokens as each result reaches the loop."""
        self.admit(request)
        results: asyncio.Queue = asyncio.Queue()
        request_id = f"{request.request_id}-{next(self._ids)}"
        self._manager.register_result_handler(request_id, results.put_nowait)
        if self._manager.add_request(list(request.prompt_token_ids), request_id=request_id, streaming=True,
                                     max_new_tokens=request.max_tokens,
                                     eos_token_id=-1 if request.ignore_eos else None) is None:
            fatal = self._fatal()
            raise RequestRejected("HF continuous batching is not accepting requests: "
                                  + ("its manager stopped" if fatal is None else f"it failed ({fatal})"))
        self._in_flight.add(request_id)
        seen, finished = 0, False
        try:
            while not finished:
                output = await results.get()
                now, finished = time.perf_counter(), output.is_finished()
                if output.error:
                    raise RequestRejected(f"HF continuous batching failed the request: {output.error}")
                new = output.generated_tokens[seen:]
                seen = len(output.generated_tokens)
                if new:
                    yield TokenChunk(time_s=now, token_ids=tuple(new))
        finally:
            self._in_flight.discard(request_id)
            if not finished and self._manager is not None:  # stopped early (cancel): free its blocks
                self._manager.cancel_request(request_id)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def drain_samples(self) -> list[EngineSample]:
        return self._samples.drain()

    async def _sample_loop(self) -> None:
        """Sample while requests are in flight, and once more after the last ends (the drop to zero)."""
        busy = False
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            processor = getattr(self._manager, "batch_processor", None)
            if processor is not None and (busy or self._in_flight):
                try:
                    self._samples.add(self._sample(processor))
                except Exception:  # another transformers version: no KV samples, the run goes on
                    log.exception("HF-CB: reading its scheduler and cache failed; no more KV samples")
                    return
            busy = bool(self._in_flight)

    def _sample(self, processor) -> EngineSample:
        """Requests running and waiting in the scheduler, and KV usage = 1 - free / total blocks."""
        scheduler, cache = processor.scheduler, processor.cache
        free = getattr(cache, "compute_free_capacity", None)  # transformers 5.17 has none: usage unknown
        return EngineSample(
            engine=self.name, time_s=time.perf_counter(), running=len(scheduler.active_requests),
            waiting=len(scheduler.waiting_requests), kv_usage=None if free is None else 1.0 - free(),
            kv_total_blocks=cache.num_blocks, kv_block_size=page_size(self.config),
        )
