"""The closed-loop driver: N concurrent users, each sending its next request when the last one ends.

Every request ends as a RequestRecord, completed, errored or cancelled, with its timings: an engine
error or a too-long prompt is data, never an exception that stops the level. Progress goes to a
callback, one call per finished request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from lab.engines.base import Engine, GenRequest, RequestCancelled, RequestRejected
from lab.status import RequestStatus

log = logging.getLogger(__name__)


@dataclass
class RequestRecord:
    """What happened to one request. Times are time.perf_counter() seconds.

    Attributes:
        engine: Engine name.
        users: The user level it ran at.
        user_id: Which closed-loop user sent it.
        request_id: The request's id (same across engines for the same workload).
        send_s: When the user sent it.
        first_token_s: When its first output token arrived (None if none did).
        end_s: When its last token arrived, or when it failed.
        token_times_s: Arrival time of every output token (vllm-engine: the time its step returned;
            TokenChunk says why).
        prompt_tokens: Prompt length.
        max_tokens: Output tokens asked for.
        status: 'ok', 'error' or 'cancelled'.
        error: Why it failed, else ''.
        scheduled_s: Open loop only: when the arrival process said to send it (send_s - scheduled_s is
            the time it waited in the client, for the concurrency cap or a busy event loop).
        turn: Its conversation's turn number (chat workload), else None.
        cached_tokens: Prompt tokens the engine served from its prefix cache; None where it does not say.
    """

    engine: str
    users: int
    user_id: int
    request_id: str
    send_s: float
    prompt_tokens: int
    max_tokens: int
    first_token_s: float | None = None
    end_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    status: RequestStatus = RequestStatus.OK
    error: str = ""
    scheduled_s: float | None = None
    turn: int | None = None
    cached_tokens: int | None = None

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)


async def send(engine: Engine, request: GenRequest, users: int, user_id: int,
               on_send: Callable[[RequestRecord], None] | None = None,
               scheduled_s: float | None = None) -> RequestRecord:
    """Run one request to its end and record it; never raises (a cancelled request is recorded too).

    ``on_send`` gets the record as the request is sent; it fills in while tokens arrive (live views).
    ``scheduled_s`` is when an open-loop schedule wanted it sent.
    """
    record = RequestRecord(
        engine=engine.name, users=users, user_id=user_id, request_id=request.request_id,
        send_s=time.perf_counter(), prompt_tokens=request.prompt_len, max_tokens=request.max_tokens,
        scheduled_s=scheduled_s, turn=request.turn,
    )
    if on_send is not None:
        on_send(record)
    try:
        problem = engine.check(request)
        if problem:
            raise RequestRejected(problem)
        async for chunk in engine.stream(request):
            if record.first_token_s is None and chunk.token_ids:
                record.first_token_s = chunk.time_s
            if chunk.cached_tokens is not None:
                record.cached_tokens = chunk.cached_tokens
            record.token_times_s.extend(chunk.token_times())
    except asyncio.CancelledError:  # swallowed on purpose: the caller re-raises after recording
        record.status, record.error = RequestStatus.CANCELLED, "run cancelled"
    except RequestCancelled as exc:
        record.status, record.error = RequestStatus.CANCELLED, str(exc)
    except RequestRejected as exc:
        record.status, record.error = RequestStatus.ERROR, str(exc)
    except Exception as exc:  # noqa: BLE001 - an engine failure is this request's data
        record.status, record.error = RequestStatus.ERROR, f"{type(exc).__name__}: {exc}"
    record.end_s = record.token_times_s[-1] if record.status == RequestStatus.OK and record.token_times_s else (
        time.perf_counter()
    )
    return record


async def run_users(engine: Engine, requests: Iterator[GenRequest] | list[Iterator[GenRequest]], users: int,
                    duration_s: float | None = None,
                    on_record: Callable[[RequestRecord], None] | None = None,
                    on_send: Callable[[RequestRecord], None] | None = None,
                    think_s: float = 0.0) -> list[RequestRecord]:
    """Drive ``users`` closed-loop users until their requests or the time run out.

    Args:
        engine: A started engine.
        requests: One shared iterator, taken in order by whichever user is free; or one iterator per user
            (the chat workload: each user sends its own conversations' turns, in order).
        users: Number of concurrent users.
        duration_s: Stop sending new requests after this long (in-flight ones finish).
        on_record: Called with each finished record (progress observers).
        on_send: Called with each record as its request is sent (it fills in live).
        think_s: A user's pause before each turn after a conversation's first (a reader reading the reply).

    Returns:
        One record per request sent, in finishing order. If the task is cancelled, in-flight requests
        are recorded as cancelled and still reach ``on_record`` before CancelledError propagates.
    """
    records: list[RequestRecord] = []
    deadline = None if duration_s is None else time.perf_counter() + duration_s
    streams = requests if isinstance(requests, list) else [requests] * users

    def finish(record: RequestRecord) -> None:
        records.append(record)
        if on_record is not None:
            on_record(record)

    async def user(user_id: int) -> None:
        for request in streams[user_id]:
            if think_s and (request.turn or 1) > 1:
                await asyncio.sleep(think_s)
            task = asyncio.ensure_future(send(engine, request, users, user_id, on_send))
            try:
                record = await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()
                finish(await task)
                raise
            finish(record)
            if deadline is not None and time.perf_counter() >= deadline:
                return

    tasks = [asyncio.ensure_future(user(u)) for u in range(users)]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        await cancel_all(tasks)
        raise
    return records


async def cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancel the tasks and wait until each has ended (each records its request as cancelled first)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_open(engine: Engine, requests: Iterator[GenRequest], times_s: Iterator[float], cap: int,
                   duration_s: float | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None,
                   on_send: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Open loop: send each request at its scheduled time, whatever the engine's speed, at most ``cap`` at once.

    Args:
        engine: A started engine.
        requests: The requests, in sending order.
        times_s: Their send times from the start (lab.load.arrivals.schedule_s).
        cap: Most requests in flight; a due request past it waits in the client (its queue time).
        duration_s: Schedule no request after this long (in-flight ones finish).
        on_record: Called with each finished record.
        on_send: Called with each record as its request is sent.

    Returns:
        One record per request sent, in finishing order; on cancel, in-flight requests are recorded as
        cancelled and reach ``on_record`` before CancelledError propagates.
    """
    records: list[RequestRecord] = []
    slots = asyncio.Semaphore(cap)
    start = time.perf_counter()

    async def one(request: GenRequest, due_s: float, index: int) -> None:
        async with slots:
            record = await send(engine, request, cap, index % cap, on_send, scheduled_s=due_s)
        records.append(record)
        if on_record is not None:
            on_record(record)

    tasks: list[asyncio.Task] = []
    try:
        for index, (request, offset) in enumerate(zip(requests, times_s, strict=False)):
            if duration_s is not None and offset > duration_s:
                break
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one(request, start + offset, index)))
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        await cancel_all(tasks)
        raise
    return records


async def complete_ids(engine: Engine, request: GenRequest) -> list[int]:
    """Run one request and return its output token ids."""
    ids: list[int] = []
    async for chunk in engine.stream(request):
        ids.extend(chunk.token_ids)
    return ids

