"""vLLM's engine ceiling: the closed-loop users fed straight into its synchronous step loop (``vllm-engine``).

The ``vllm`` engine serves through AsyncLLM, vLLM's async front end, as a server does: each token of each
request crosses an output handler and an asyncio queue. Here one worker thread drives ``LLMEngine``
itself, as offline ``LLM.generate`` does: it adds the requests that arrived, calls ``step()``, and stamps
every token of that step with the one time the step returned. The tokens reach their users in batches
(at most every FLUSH_S, and at once when a request ends, so its user's next request joins at the next
step), each keeping its step's time. The gap between the two engines is the per-token cost of the async
front end.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from lab.engines.base import EngineInfo, GenRequest, RequestCancelled, RequestRejected, TokenChunk
from lab.engines.vllm import VLLMEngine, _sampler_factory, engine_args, shut_down

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # how long the idle loop waits for a request before looking again
FLUSH_S = 0.02  # tokens cross to the event loop at most this often (stamped per step all the same)
_END = object()


@dataclass
class StepSlot:
    """One request in the step loop, with the asyncio queue its items go to (in batches: lists)."""

    request: GenRequest
    out: asyncio.Queue
    request_id: str = ""
    token_ids: list = field(default_factory=list)  # made since the last hand-over
    times_s: list = field(default_factory=list)  # each one's step time
    last: object = None  # the end, or why it stopped, once it left the loop

    def stamp(self, token_ids, now: float) -> None:
        """Keep one step's tokens, each stamped with the step's time."""
        self.token_ids.extend(token_ids)
        self.times_s.extend([now] * len(token_ids))

    def has_items(self) -> bool:
        """Whether a hand-over has anything for this request's user."""
        return bool(self.token_ids) or self.last is not None

    def take(self) -> list:
        """What the request's user gets at this hand-over: one chunk of its tokens (each with its own
        step's time), then the end if it came."""
        items = []
        if self.token_ids:
            items.append(TokenChunk(self.times_s[0], tuple(self.token_ids), tuple(self.times_s)))
            self.token_ids, self.times_s = [], []
        if self.last is not None:
            items.append(self.last)
        return items


def _put_all(batch: list) -> None:
    """On the event loop: one call per flush hands every request its items."""
    for out, items in batch:
        out.put_nowait(items)


class StepLoop:
    """The worker's loop over any object with vLLM's LLMEngine methods (add_request, step,
    has_unfinished_requests, abort_request); tokens go to each slot's queue on ``loop``."""

    def __init__(self, core, loop: asyncio.AbstractEventLoop, params_for):
        self.core, self.loop, self.params_for = core, loop, params_for
        self.incoming: queue.Queue = queue.Queue()
        self.aborts: queue.Queue = queue.Queue()
        self.slots: dict[str, StepSlot] = {}
        self.ended: list[StepSlot] = []  # left the loop since the last flush, items still pending
        self.stopping = False
        self.wake = threading.Event()
        self.flushed_s = 0.0
        self.lock = threading.Lock()  # a request sent as the loop dies is answered by one of the two sides
        self.failure: str | None = None

    def submit(self, slot: StepSlot) -> None:
        """From the event loop: a request for the next step (refused at once when the loop has died)."""
        with self.lock:
            refused = self.failure
            if refused is None:
                self.incoming.put(slot)
        if refused is not None:
            slot.out.put_nowait([RequestRejected(refused)])
        self.wake.set()

    def cancel(self, request_id: str) -> None:
        """From the event loop: stop a request at the next step (its blocks are freed)."""
        self.aborts.put(request_id)
        self.wake.set()

    def run(self) -> None:
        """Add what arrived, step, deliver; wait briefly when idle; until stop()."""
        while not self.stopping:
            self.admit()
            if not self.core.has_unfinished_requests():
                self.wait_for_work()
                continue
            outputs = self.core.step()
            self.deliver(outputs, time.perf_counter())
            self.flush()

    def wait_for_work(self) -> None:
        self.wake.wait(IDLE_WAIT_S)
        self.wake.clear()

    def admit(self) -> None:
        """Add every request that arrived since the last step, then abort what was cancelled."""
        while not self.incoming.empty():
            slot = self.incoming.get()
            self.slots[slot.request_id] = slot
            prompt, params = self.params_for(slot.request)
            try:
                self.core.add_request(slot.request_id, prompt, params)
            except Exception as exc:  # noqa: BLE001 - one bad request is that request's error
                self.end(slot, RequestRejected(f"vLLM rejected the request: {exc}"))
        while not self.aborts.empty():
            slot = self.slots.get(self.aborts.get())
            if slot is not None:
                self.core.abort_request([slot.request_id])
                self.end(slot, RequestCancelled("cancelled"))
        if self.ended:
            self.flush(force=True)

    def deliver(self, outputs, now: float) -> None:
        """Every request's tokens of this step, all stamped with the step's end; finished ones end."""
        for output in outputs:
            slot = self.slots.get(output.request_id)
            if slot is None:
                continue
            if output.outputs:
                slot.stamp(output.outputs[0].token_ids, now)
            if output.finished:
                self.end(slot, _END)

    def end(self, slot: StepSlot, last) -> None:
        """The slot leaves the loop; ``last`` (the end, or why it stopped) follows its tokens."""
        slot.last = last
        self.slots.pop(slot.request_id, None)
        self.ended.append(slot)

    def flush(self, force: bool = False) -> None:
        """Hand the pending items over in one event-loop call: at once when a request ended (its user sends
        the next one), else at most every FLUSH_S (one wake-up per request per flush, not per step)."""
        now = time.perf_counter()
        if not (force or self.ended or now - self.flushed_s >= FLUSH_S):
            return
        batch = [(slot.out, slot.take()) for slot in [*self.slots.values(), *self.ended] if slot.has_items()]
        self.ended, self.flushed_s = [], now
        if batch:
            self.loop.call_soon_threadsafe(_put_all, batch)

    def fail_all(self, error: Exception) -> None:
        """The loop died: every request in flight, or sent and not yet added, gets the error."""
        with self.lock:
            self.failure = str(error)
        while not self.incoming.empty():
            slot = self.incoming.get()
            self.slots[slot.request_id] = slot
        for slot in list(self.slots.values()):
            self.end(slot, RequestRejected(self.failure))
        self.flush(force=True)


def keep_lab_sampler(engine) -> None:
    """Of vLLM's stat loggers keep only the lab's sampler: engine mode serves no /metrics and logs no
    throughput lines, and vLLM's Prometheus logger observes every token's inter-token latency at every
    step. The scheduler's stats (KV blocks, queues, prefix hits) still reach the sampler each step."""
    manager = getattr(engine, "logger_manager", None)
    if manager is not None:
        manager.stat_loggers = [each for each in manager.stat_loggers if _wraps_lab_sampler(each)]


def _wraps_lab_sampler(stat_logger) -> bool:
    inner = getattr(stat_logger, "per_engine_stat_loggers", {}).values()
    return any(getattr(each, "lab_sampler", False) for each in inner)


class VLLMStepEngine(VLLMEngine):
    """vLLM's LLMEngine driven step by step from one thread: the engine's own ceiling, no async front end."""

    name = "vllm-engine"

    def __init__(self, config, model_path: str):
        super().__init__(config, model_path)
        self._steps: StepLoop | None = None
        self._thread: threading.Thread | None = None
        self._failure: str | None = None

    async def start(self) -> EngineInfo:
        kwargs, sources, attention = self._prepare()
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self._engine = await asyncio.to_thread(LLMEngine.from_engine_args, engine_args(EngineArgs, kwargs),
                                               stat_loggers=[_sampler_factory(self)])
        keep_lab_sampler(self._engine)
        self.info = await asyncio.to_thread(self._describe, kwargs, sources, attention)
        self.info.args["batching"] = "continuous (PagedAttention), LLMEngine.step() loop: no async front end"
        self.info.args["stat_loggers"] = "the lab's sampler only (no Prometheus, no log lines: nothing serves them)"
        self._steps = StepLoop(self._engine, asyncio.get_running_loop(), self._params)
        self._thread = threading.Thread(target=self._serve, name="vllm-step-loop", daemon=True)
        self._thread.start()
        return self.info

    def _serve(self) -> None:
        try:
            self._steps.run()
        except Exception as exc:
            log.exception("vLLM's step loop failed")
            self._failure = f"vLLM's step loop failed: {type(exc).__name__}: {exc}"
            self._steps.fail_all(exc)

    @staticmethod
    def _params(request: GenRequest) -> tuple:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=request.ignore_eos, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA, detokenize=False)
        return TokensPrompt(prompt_token_ids=list(request.prompt_token_ids)), params

    async def stop(self) -> None:
        if self._steps is not None:
            self._steps.stopping = True
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        if self._engine is not None:
            engine, self._engine = self._engine, None
            shut_down(engine.engine_core)

    async def reset(self) -> None:
        if self._engine is not None:
            self._engine.reset_prefix_cache()  # between levels: the loop is idle, nothing is in flight

    def alive(self) -> bool:
        resources = getattr(getattr(self._engine, "engine_core", None), "resources", None)
        running = self._thread is not None and self._thread.is_alive()
        return running and self._failure is None and not getattr(resources, "engine_dead", True)

    def _stop_reason(self) -> str:
        return self._failure or "vLLM's step loop stopped"

    async def abort_all(self) -> None:
        for request_id in list(self._steps.slots if self._steps else ()):
            self._steps.cancel(request_id)

    async def stream(self, request: GenRequest):
        """Hand the request to the step loop and yield its tokens, one chunk per hand-over (each token
        stamped with its step's time)."""
        self.admit(request)
        slot = StepSlot(request=request, out=asyncio.Queue(), request_id=f"{request.request_id}-{next(self._ids)}")
        self._clock.arrive(time.perf_counter())
        self._steps.submit(slot)
        done = False
        try:
            while not done:
                for item in await slot.out.get():
                    if item is _END:
                        done = True
                    elif isinstance(item, BaseException):
                        done = True
                        raise item
                    else:
                        yield item
        finally:
            self._clock.leave()
            if not done:  # cancelled by the driver: free its blocks at the next step
                self._steps.cancel(slot.request_id)
