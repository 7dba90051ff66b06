"""An instant or delayed fake engine, for unit tests of the load generator and its overhead bench.

It takes a per-token delay and an error rate; it never imports torch or vllm.
"""

from __future__ import annotations

import asyncio
import random
import time

from lab.engines.base import EngineInfo, EngineSample, GenRequest, RequestRejected, TokenChunk, check_fits


class FakeEngine:
    """Streams max_tokens copies of ``token_id``, token_delay_s apart; fails a share of requests."""

    def __init__(self, name: str = "fake", token_delay_s: float = 0.0, error_rate: float = 0.0,
                 max_model_len: int = 2048, seed: int = 0, token_id: int = 7):
        self.name = name
        self.token_id = token_id
        self.token_delay_s = token_delay_s
        self.error_rate = error_rate
        self.max_model_len = max_model_len
        self._rng = random.Random(seed)
        self._running = 0
        self._samples: list[EngineSample] = []
        self.started = self.stopped = False
        self.failure: str | None = None  # set by a test: the engine "dies" with this reason
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        self.started = True
        self.info = EngineInfo(name=self.name, args={"token_delay_s": self.token_delay_s})
        return self.info

    def check(self, request: GenRequest) -> str | None:
        return check_fits(request, self.max_model_len)

    async def stream(self, request: GenRequest):
        problem = self.check(request)
        if problem:
            raise RequestRejected(problem)
        if self.failure:
            raise RequestRejected(self.failure)
        if self._rng.random() < self.error_rate:
            raise RequestRejected("fake engine error")
        self._running += 1
        try:
            for _ in range(request.max_tokens):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                self._samples.append(EngineSample(self.name, time.perf_counter(), self._running, 0))
                yield TokenChunk(time_s=time.perf_counter(), token_ids=(self.token_id,))
        finally:
            self._running -= 1

    def drain_samples(self) -> list[EngineSample]:
        taken, self._samples = self._samples, []
        return taken

    async def reset(self) -> None:
        pass

    def alive(self) -> bool:
        return self.failure is None

    def fault(self) -> str | None:
        return self.failure

    async def abort_all(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def decode(self, token_ids: list[int]) -> str:
        return " ".join(str(t) for t in token_ids)
