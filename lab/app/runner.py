"""One event loop in a thread of its own, and the one task on it: what runs, experiments and sweeps share.

Engines are bound to the loop they were started on (vLLM's output handler, the HF worker's call-backs), so
everything the host does is submitted to this loop. One task at a time: ``start`` refuses nothing itself (the
host decides), ``cancel`` asks the task to stop, ``on_loop`` reads state where nothing changes it meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from lab.session import new_loop


def poll_until(done: Callable[[], bool], timeout_s: float | None, every_s: float = 0.2) -> bool:
    """Wait until done() is true or timeout_s passes; returns done()."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


class TaskRunner:
    """The host's loop thread and its one task; ``on_end`` is called on the loop as each task ends."""

    def __init__(self, on_end: Callable[[], None]):
        self.on_end = on_end
        self._task: asyncio.Task | None = None
        self._loop = new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lab-host", daemon=True)
        self._thread.start()

    def submit(self, coro) -> Future:
        """Run a coroutine on the loop (not as the task); its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def start(self, coro) -> None:
        """Run ``coro`` as the one task."""
        async def start() -> None:
            self._task = asyncio.ensure_future(coro)
            self._task.add_done_callback(lambda _: self.on_end())

        self.submit(start()).result(timeout=10)

    def running(self) -> bool:
        """Whether the task goes."""
        return self._task is not None and not self._task.done()

    def cancel(self) -> None:
        """Ask the task to stop (it keeps what it measured)."""
        self._loop.call_soon_threadsafe(self._task.cancel)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the task has ended (or the timeout passes); True when it has."""
        return poll_until(lambda: not self.running(), timeout_s)

    def on_loop(self, fn, timeout_s: float | None = None):
        """``fn()`` called on the loop, where runs and engines change what they hold: a copy made there is
        consistent (lab.app.host_process cuts the page's parts so). Raises TimeoutError past ``timeout_s``."""
        async def call():
            return fn()

        future = self.submit(call())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop (after the host stopped its engines on it)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
