"""vLLM's step loop (vllm-engine) on a fake LLMEngine: one timestamp per step, joins, cancels, rejections.

The real LLMEngine runs in tests/test_engines.py; here the loop's own logic is checked exactly.
"""

import asyncio
import threading
import time
from types import SimpleNamespace

from lab.config import EngineConfig
from lab.engines.base import GenRequest, RequestRejected
from lab.engines.vllm_engine import _END, StepLoop, StepSlot, VLLMStepEngine
from lab.load.driver import run_users
from lab.status import RequestStatus


class FakeCore:
    """LLMEngine's four methods the loop uses: each step makes one token for every unfinished request."""

    def __init__(self):
        self.left: dict[str, int] = {}
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, request_id, prompt, max_tokens):
        if max_tokens > 50:
            raise ValueError("too long for this fake")
        self.left[request_id] = max_tokens

    def has_unfinished_requests(self):
        return bool(self.left)

    def abort_request(self, request_ids):
        for request_id in request_ids:
            self.left.pop(request_id, None)
            self.aborted.append(request_id)

    def step(self):
        self.steps += 1
        outputs = []
        for request_id in list(self.left):
            self.left[request_id] -= 1
            finished = self.left[request_id] == 0
            if finished:
                del self.left[request_id]
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished,
                                           outputs=[SimpleNamespace(token_ids=[7])]))
        return outputs


def engine_on(core: FakeCore, loop: asyncio.AbstractEventLoop) -> VLLMStepEngine:
    engine = VLLMStepEngine(EngineConfig(device="cpu"), "unused")
    engine._steps = StepLoop(core, loop, lambda request: (None, request.max_tokens))
    engine._thread = threading.Thread(target=engine._serve, daemon=True)
    engine._thread.start()
    return engine


def run_with(core: FakeCore, requests, users: int):
    async def go():
        engine = engine_on(core, asyncio.get_running_loop())
        try:
            return await run_users(engine, iter(requests), users)
        finally:
            engine._steps.stopping = True

    return asyncio.run(go())


def test_every_token_of_a_step_gets_the_steps_one_timestamp():
    requests = [GenRequest("a", (1, 2), 3), GenRequest("b", (1, 2), 5)]
    records = {r.request_id: r for r in run_with(FakeCore(), requests, users=2)}
    a, b = records["a"], records["b"]
    assert (a.status, a.output_tokens, b.status, b.output_tokens) == (RequestStatus.OK, 3, RequestStatus.OK, 5)
    shared = set(a.token_times_s) & set(b.token_times_s)
    assert len(shared) >= 2  # the steps both were in stamped both with one time
    assert b.token_times_s == sorted(b.token_times_s) and len(set(b.token_times_s)) == 5


def test_a_freed_user_joins_at_a_later_step_and_rejections_are_per_request():
    core = FakeCore()
    requests = [GenRequest("short", (1,), 2), GenRequest("next", (1,), 2), GenRequest("huge", (1,), 99)]
    records = {r.request_id: r for r in run_with(core, requests, users=1)}
    assert records["short"].status == records["next"].status == RequestStatus.OK
    assert records["next"].send_s >= records["short"].end_s  # closed loop: one user, one at a time
    assert records["huge"].status == RequestStatus.ERROR and "vLLM rejected the request" in records["huge"].error
    assert core.steps == 4


def test_a_cancelled_request_is_aborted_in_the_engine():
    class Slow(FakeCore):
        def step(self):
            time.sleep(0.01)
            return super().step()

    core = Slow()

    async def go():
        engine = engine_on(core, asyncio.get_running_loop())
        task = asyncio.ensure_future(run_users(engine, iter([GenRequest("long", (1,), 40)]), 1))
        await asyncio.sleep(0.1)
        task.cancel()
        records = await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.1)  # the loop takes the abort at its next step
        engine._steps.stopping = True
        return records

    asyncio.run(go())
    assert any(request_id.startswith("long") for request_id in core.aborted) and not core.left


def test_steps_quicker_than_a_flush_reach_the_user_together_each_token_keeping_its_steps_time():
    class Quick(FakeCore):
        def step(self):
            time.sleep(0.002)
            return super().step()

    async def go():
        engine = engine_on(Quick(), asyncio.get_running_loop())
        try:
            return [chunk async for chunk in engine.stream(GenRequest("r", (1,), 40))]
        finally:
            engine._steps.stopping = True

    chunks = asyncio.run(go())
    times = [t for chunk in chunks for t in chunk.token_times()]
    assert sum(len(chunk.token_ids) for chunk in chunks) == 40 and len(chunks) < 40  # handed over in batches
    assert times == sorted(times) and len(set(times)) == 40  # still one time per step
    assert all(chunk.time_s == chunk.token_times()[0] for chunk in chunks)


def test_a_hand_over_gives_the_tokens_first_then_the_end():
    slot = StepSlot(request=GenRequest("r", (1,), 3), out=None)
    slot.stamp([5, 6], 1.0)
    slot.stamp([7], 2.0)
    slot.last = _END
    chunk, end = slot.take()
    assert (chunk.token_ids, chunk.token_times(), end) == ((5, 6, 7), [1.0, 1.0, 2.0], _END)
    assert not slot.token_ids and chunk.time_s == 1.0


def test_a_dead_loop_answers_what_waited_to_join_and_refuses_what_comes_after():
    async def go():
        steps = StepLoop(FakeCore(), asyncio.get_running_loop(), lambda request: (None, request.max_tokens))
        waiting, late = (StepSlot(GenRequest(name, (1,), 3), asyncio.Queue(), name) for name in ("waiting", "late"))
        steps.submit(waiting)  # sent, not yet added by the loop
        steps.fail_all(RuntimeError("boom"))
        steps.submit(late)
        return [await asyncio.wait_for(slot.out.get(), 1) for slot in (waiting, late)]

    answers = asyncio.run(go())
    assert all(isinstance(items[-1], RequestRejected) and "boom" in str(items[-1]) for items in answers)
