"""The baseline: HuggingFace transformers generate() with static batching.

Waiting requests are gathered into one left-padded batch (up to hf_max_batch_size); the batch runs
until its longest request is done; requests that arrive meanwhile wait for the next batch. This is the
naive loop of the seeds' hf_baseline.py, served to concurrent users.

Each decoding step is observed by a StoppingCriteria that stamps the time, hands each request its own
new token (only the tokens it asked for are counted), marks a request done at its own length, and
samples the KV cache the batch holds. generate() runs in a worker thread; tokens cross to the asyncio
side with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

from lab.config import EngineConfig
from lab.engines.base import (
    EngineInfo,
    EngineSample,
    GenRequest,
    LocalEngine,
    RequestCancelled,
    RequestRejected,
    StepClock,
    TokenChunk,
    kv_bytes_per_token,
)

log = logging.getLogger(__name__)

_END = object()  # marks the end of one request's stream
GATHER_S = 0.005  # how long the worker waits for more arrivals once one request is waiting


@dataclass
class _Slot:
    """One request inside a batch, with the asyncio queue its tokens go to."""

    request: GenRequest
    out: asyncio.Queue
    made: int = 0
    done: bool = False


@dataclass
class _Batch:
    slots: list[_Slot]
    padded_len: int
    epoch: int
    step: int = 0
    fillers: int = 0  # rows that only keep a compiled batch's shape (hf_compile)


def default_hf_threads() -> int:
    """cores - 1 (at least 1): leaves a core to the event loop and the UI."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass
class LoadedModel:
    """A transformers model on its device, with its tokenizer and how its attention runs."""

    torch: object
    tokenizer: object
    model: object
    device: str
    threads: int
    attention: str


def load_model(config: EngineConfig, model_path: str) -> LoadedModel:
    """Load the model (or random weights of its shape) for a transformers engine: torch threads on CPU,
    cuDNN attention as configured on CUDA, the config's dtype, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = config.resolved_device()
    threads = config.hf_threads or default_hf_threads()
    if device == "cpu":
        torch.set_num_threads(threads)
        attention = f"sdpa (CPU, {threads} thread{'s' if threads > 1 else ''})"
    else:
        torch.backends.cuda.enable_cudnn_sdp(config.hf_cudnn_sdp)
        attention = "sdpa, cuDNN on (PyTorch default)" if config.hf_cudnn_sdp else "sdpa, cuDNN off (fair setting)"
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dtype = getattr(torch, config.resolved_dtype())
    if config.load_format == "dummy":  # random weights of the model's shape, made on the device itself
        from transformers import AutoConfig

        with torch.device(device):  # an 8B shape built on the host first took 4 minutes
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=dtype,
                                                     attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device)
    model.eval()
    return LoadedModel(torch, tokenizer, model, device, threads, attention)


class HFEngine(LocalEngine):
    """Static-batch transformers generate() behind the async Engine protocol."""

    name = "hf"

    def __init__(self, config: EngineConfig, model_path: str):
        super().__init__(config, model_path)
        self._pending: queue.Queue = queue.Queue()
        self._clock = StepClock()  # a step: one generate() iteration, from the batch's start or the last one
        self._abort_epoch = 0  # abort_all() bumps it: batches started before then stop
        self._thread: threading.Thread | None = None
        self._fault: str | None = None  # the last batch's failure since reset, in words
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cache = None  # hf_compile's static KV cache, made at the first batch

    # -- life cycle ---------------------------------------------------------------------------
    async def start(self) -> EngineInfo:
        self._loop = asyncio.get_running_loop()
        self.info = await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()
        return self.info

    def _load(self) -> EngineInfo:
        loaded = load_model(self.config, self.model_path)
        self.torch, self.tokenizer, self.model = loaded.torch, loaded.tokenizer, loaded.model
        device, threads, attention = loaded.device, loaded.threads, loaded.attention
        self.device = device
        per_token = kv_bytes_per_token(self.model.config, self.config.resolved_dtype())
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = next(iter(self.eos_ids), 0)
        memory = sum(p.numel() * p.element_size() for p in self.model.parameters())
        args = {
            "batching": "static (left-padded, runs until its longest request is done)",
            "max_batch_size": self.config.hf_max_batch_size,
            "dtype": self.config.resolved_dtype(),
            "device": device,
            "attention": attention,
            "max_model_len": self.config.max_model_len,
            "decoding": "greedy",
            "load_format": self.config.load_format,
        }
        if self.config.hf_compile:
            args["batching"] += f"; every batch padded to {self.config.hf_max_batch_size} rows"
            args["cache"] = ("static, max_model_len per row; torch.compile (reduce-overhead) on CUDA"
                             if device == "cuda" else "static, max_model_len per row (no compile off CUDA)")
        if device == "cpu":
            args["torch_threads"] = threads
        return EngineInfo(
            name=self.name, args=args, kv_bytes_per_token=per_token, memory_bytes=memory,
            attention=attention,
        )

    async def stop(self) -> None:
        self._abort_epoch += 1
        self._pending.put(None)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        self.model = None

    async def reset(self) -> None:
        """Nothing is cached across requests (each static batch starts from an empty cache); forget a failure."""
        self._fault = None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def fault(self) -> str | None:
        return self._fault if self.alive() else "HF's worker thread is not running"

    async def abort_all(self) -> None:
        self._abort_epoch += 1
        while True:  # fail what has not started
            try:
                slot = self._pending.get_nowait()
            except queue.Empty:
                break
            if slot is not None:
                self._push(slot, RequestCancelled("cancelled before it ran"))

    # -- requests -----------------------------------------------------------------------------
    async def stream(self, request: GenRequest):
        """Queue the request for the next static batch and yield its tokens as they are made."""
        self.admit(request)
        slot = _Slot(request=request, out=asyncio.Queue())
        self._pending.put(slot)
        while True:
            item = await slot.out.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def logprob_gap(self, prompt: tuple[int, ...], mine: list[int], at: int, other: list[int]) -> float | None:
        """log p(my token) - log p(the other's token) at position ``at`` of two answers sharing a prefix.

        Used by the agreement check to tell a near-tie from a different computation; None past an answer.
        """
        if at >= len(mine) or at >= len(other):
            return None
        torch = self.torch
        ids = torch.tensor([list(prompt) + mine[:at]], device=self.device)
        with torch.inference_mode():
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0, -1].float(), dim=-1)
        return float(logp[mine[at]] - logp[other[at]])

    def time_per_token(self, prompt: tuple[int, ...], new_tokens: int, use_cache: bool) -> float:
        """Seconds per output token of one greedy generate() of exactly ``new_tokens``, with its KV cache or
        recomputing every past token at each step (the cache experiment; call while no batch runs)."""
        torch = self.torch
        ids = torch.tensor([list(prompt)], device=self.device)
        with torch.inference_mode():
            began = time.perf_counter()
            self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache,
                                pad_token_id=self.pad_id)
            return (time.perf_counter() - began) / new_tokens

    def drain_samples(self) -> list[EngineSample]:
        return self._samples.drain()

    # -- the worker thread --------------------------------------------------------------------
    def _push(self, slot: _Slot, item) -> None:
        self._loop.call_soon_threadsafe(slot.out.put_nowait, item)

    def _serve(self) -> None:
        if self.config.hf_compile and self.device.startswith("cuda"):
            graph_trees_in_this_thread()
        while True:
            first = self._pending.get()
            if first is None:
                return
            slots = self._gather(first)
            if slots is None:
                return
            try:
                self._run_batch(slots)
            except Exception as exc:
                log.exception("HF batch failed")
                from lab.engines.failures import failure_words

                self._fault = failure_words("HF", exc, self.config.resolved_device(), len(slots))
                for slot in slots:
                    if not slot.done:
                        slot.done = True
                        self._push(slot, RequestRejected(self._fault))
                self._sample(None)

    def _gather(self, first: _Slot) -> list[_Slot] | None:
        slots = [first]
        deadline = time.perf_counter() + GATHER_S
        while len(slots) < self.config.hf_max_batch_size:
            try:
                slot = self._pending.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if slot is None:
                return None
            slots.append(slot)
        return slots

    def _run_batch(self, slots: list[_Slot]) -> None:
        torch = self.torch
        padded = max(s.request.prompt_len for s in slots)
        fillers = self.config.hf_max_batch_size - len(slots) if self.config.hf_compile else 0
        rows = [s.request for s in slots] + [slots[0].request] * fillers
        ids = [[self.pad_id] * (padded - r.prompt_len) + list(r.prompt_token_ids) for r in rows]
        mask = [[0] * (padded - r.prompt_len) + [1] * r.prompt_len for r in rows]
        input_ids = torch.tensor(ids, device=self.device)
        attention_mask = torch.tensor(mask, device=self.device)
        batch = _Batch(slots=slots, padded_len=padded, epoch=self._abort_epoch, fillers=fillers)
        self._sample(batch)  # the batch is formed: prefill of batch x padded length starts now
        self._clock.arrive(time.perf_counter())
        try:
            self._generate(batch, input_ids, attention_mask)
        finally:
            self._clock.leave()
        for slot in slots:  # generate() returned: every request gets its answer now
            if not slot.done:
                slot.done = True
                self._push(slot, _END)

    def _generate(self, batch: _Batch, input_ids, attention_mask) -> None:
        slots, torch = batch.slots, self.torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        with torch.inference_mode():
            self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(s.request.max_tokens for s in slots),
                do_sample=False,
                pad_token_id=self.pad_id,
                stopping_criteria=StoppingCriteriaList([_StepObserver(self, batch)]),
                logits_processor=LogitsProcessorList([_SuppressEos(self, batch)]),
                **self._static_cache(),
            )

    def _static_cache(self) -> dict:
        """hf_compile: one static KV cache of max_model_len tokens per row, reset between batches, which generate()
        compiles its decode step for on CUDA (torch.compile, mode reduce-overhead: CUDA graphs); rows are padded to
        hf_max_batch_size, so one batch shape is compiled once. Otherwise nothing: generate()'s dynamic cache."""
        if not self.config.hf_compile:
            return {}
        if self._cache is None:  # one cache for every batch: CUDA graphs replay on its fixed addresses
            from transformers import StaticCache

            self._cache = StaticCache(config=self.model.config, max_cache_len=self.config.max_model_len)
        else:
            self._cache.reset()
        return {"past_key_values": self._cache}

    def _on_step(self, batch: _Batch, last_tokens: list[int]) -> list[bool]:
        now = time.perf_counter()
        batch.step += 1
        aborted = batch.epoch != self._abort_epoch
        endings, step_s, useful = [], self._clock.step(now), sum(not slot.done for slot in batch.slots)
        for slot, token in zip(batch.slots, last_tokens, strict=True):
            if slot.done:
                continue
            slot.made += 1
            self._push(slot, TokenChunk(time_s=now, token_ids=(token,)))
            at_eos = not slot.request.ignore_eos and token in self.eos_ids
            if slot.made >= slot.request.max_tokens or at_eos:
                slot.done = True
                endings.append((slot, _END))
            elif aborted:
                slot.done = True
                endings.append((slot, RequestCancelled("cancelled")))
        all_done = all(slot.done for slot in batch.slots)
        self._sample(None if all_done else batch, step_s, useful)  # before the last answer goes out: the level sees it
        for slot, item in endings:
            self._push(slot, item)
        return [slot.done for slot in batch.slots]

    def _sample(self, batch: _Batch | None, step_s: float | None = None, step_tokens: int | None = None) -> None:
        per_token = self.info.kv_bytes_per_token if self.info else 0
        slots = slot_kinds(batch, self._cache_len()) if batch is not None else dict.fromkeys(KINDS_HELD, 0)
        sample = EngineSample(
            engine=self.name, time_s=time.perf_counter(), running=len(batch.slots) if batch else 0,
            waiting=self._pending.qsize(), kv_reserved_bytes=slots["held"] * per_token,
            kv_real_bytes=slots["real"] * per_token, kv_reservation_bytes=slots["reservation"] * per_token,
            kv_internal_bytes=slots["internal"] * per_token, kv_external_bytes=slots["external"] * per_token,
            step_s=step_s, step_tokens=step_tokens,
        )
        self._samples.add(sample)

    def _cache_len(self) -> int | None:
        """Slots per row of the static cache (hf_compile); None for generate()'s dynamic cache."""
        return self.config.max_model_len if self.config.hf_compile else None


KINDS_HELD = ("held", "real", "reservation", "internal", "external")


def slot_kinds(batch: _Batch, cache_len: int | None) -> dict[str, int]:
    """The KV token slots a batch holds, by kind (the vLLM paper's terms).

    held: every row's slots: a static cache's rows x ``cache_len``, reserved up front; generate()'s dynamic cache
    (``cache_len`` None) grows each row to padded prompt + steps so far. real: running requests' prompt and
    output so far. reservation: slots a running request will still fill, up to its max_tokens (a static cache
    only). external: rows no request holds (the filler rows that keep a compiled batch's shape). internal: the
    rest, slots inside a request's row it never fills: left padding, past its own end, a finished request's row.
    """
    row = cache_len or batch.padded_len + batch.step
    live = [s for s in batch.slots if not s.done]
    held = row * (len(batch.slots) + batch.fillers)
    real = sum(s.request.prompt_len + s.made for s in live)
    reservation = sum(s.request.max_tokens - s.made for s in live) if cache_len else 0
    external = row * batch.fillers
    return {"held": held, "real": real, "reservation": reservation, "external": external,
            "internal": held - real - reservation - external}


class _StepObserver:
    """A StoppingCriteria called after every step: stamps times and stops each request at its length."""

    def __init__(self, engine: HFEngine, batch: _Batch):
        self.engine, self.batch = engine, batch

    def __call__(self, input_ids, scores, **kwargs):
        done = self.engine._on_step(self.batch, input_ids[:len(self.batch.slots), -1].tolist())
        return self.engine.torch.tensor(done + [True] * self.batch.fillers, device=input_ids.device)


class _SuppressEos:
    """A LogitsProcessor that forbids EOS for requests that asked for exact lengths."""

    def __init__(self, engine: HFEngine, batch: _Batch):
        self.engine = engine
        self.rows = [i for i, s in enumerate(batch.slots) if s.request.ignore_eos]
        self.eos = sorted(engine.eos_ids)

    def __call__(self, input_ids, scores):
        if self.rows and self.eos:
            rows = self.engine.torch.tensor(self.rows, device=scores.device)
            for token in self.eos:
                scores[rows, token] = float("-inf")
        return scores


def graph_trees_in_this_thread() -> None:
    """Give this thread the state torch.compile's CUDA graphs (mode reduce-overhead) keep per thread. torch 2.11 sets
    it up only in the thread that first imported torch._inductor.cudagraph_trees and fails a call from any other
    thread with a bare AssertionError (get_obj); 2.13 sets it up lazily. In the lab, vLLM on CUDA may import it
    first, from the main thread."""
    from collections import defaultdict

    from torch._inductor import cudagraph_trees

    if not hasattr(cudagraph_trees.local, "tree_manager_containers"):
        cudagraph_trees.local.tree_manager_containers = {}
        cudagraph_trees.local.tree_manager_locks = defaultdict(threading.Lock)
