"""The one async protocol every engine speaks, and the data that crosses it.

The load driver knows engines only through ``Engine``: start, check a request, stream its tokens,
hand over the stats samples taken since the last call, reset between runs, stop. Concrete engines
(hf, vllm, fake) live beside this file; nothing here imports torch or vllm.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class RequestRejected(Exception):
    """A request the engine refuses before running it (recorded as an error, never fatal)."""


class RequestCancelled(RequestRejected):
    """A request stopped because its run was cancelled (recorded as cancelled, not as an error)."""


class EngineFault(Exception):
    """An engine died or failed its work (out of memory, a worker that raised): the level and run end failed."""


@dataclass(frozen=True)
class GenRequest:
    """One generation request, already tokenized so that both engines see the same prompt.

    Attributes:
        request_id: Unique across the engine's lifetime.
        prompt_token_ids: The prompt, as token ids.
        max_tokens: Output tokens asked for; with ignore_eos, exactly this many are made.
        ignore_eos: Keep generating past EOS (exact output lengths).
        turn: A conversation's turn number (1 first; the chat workload), None for single requests.
        messages: The chat messages the prompt was templated from, as (role, text) pairs: an endpoint sends
            these to /v1/chat/completions; in-process engines read the token ids.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool = True
    turn: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class TokenChunk:
    """Tokens handed to the caller together (perf_counter seconds).

    Streaming engines stamp a token when it reaches the caller; vllm-engine stamps every token of a step with
    the time the step returned, and hands several steps over at once (at most 20 ms later).

    Attributes:
        time_s: The first token's time (every token's, when times_s is empty).
        token_ids: The tokens.
        times_s: Each token's own time, where one hand-over carries tokens made at different instants
            (the step loop's batch of steps); empty when all were made at time_s.
        cached_tokens: Prompt tokens the engine found in its prefix cache (vLLM's num_cached_tokens, a server's
            usage.prompt_tokens_details), on the chunk that knows it; None where the engine does not say.
    """

    time_s: float
    token_ids: tuple[int, ...]
    times_s: tuple[float, ...] = ()
    cached_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.times_s and len(self.times_s) != len(self.token_ids):
            raise ValueError(f"{len(self.times_s)} times for {len(self.token_ids)} tokens")

    def token_times(self) -> list[float]:
        """When each token was made."""
        return list(self.times_s) if self.times_s else [self.time_s] * len(self.token_ids)


@dataclass(frozen=True)
class EngineSample:
    """What an engine's scheduler looked like at one instant.

    vLLM fills the block fields from its SchedulerStats (kv_usage = 1 - free/total blocks, vLLM's own
    definition). HF fills the byte fields from the shapes of its static batch: reserved is what the
    batch's contiguous cache holds (batch x padded length; with a static cache, its rows x their reserved
    length), real the part holding running requests' own prompt and output tokens, and the rest by kind, in
    the vLLM paper's terms: reservation (slots a running request will still fill), internal fragmentation
    (slots of a request's row it never fills: padding, past its end, a finished request's row) and external
    fragmentation (rows no request holds).
    """

    engine: str
    time_s: float
    running: int
    waiting: int
    kv_usage: float | None = None
    kv_total_blocks: int | None = None
    kv_block_size: int | None = None
    kv_reserved_bytes: int | None = None
    kv_real_bytes: int | None = None
    kv_reservation_bytes: int | None = None
    kv_internal_bytes: int | None = None
    kv_external_bytes: int | None = None
    preemptions_total: int = 0
    prefix_queries_total: int = 0
    prefix_hits_total: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache at this step
    prefix_hits: int = 0  # of which found cached
    step_s: float | None = None  # the sample closes one engine step (one forward pass) that took this long
    step_tokens: int | None = None  # output tokens that step made, where the engine says


class SampleBuffer:
    """Samples appended by an engine's thread or callback, drained by the driver's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[EngineSample] = []

    def add(self, sample: EngineSample) -> None:
        """Keep one sample."""
        with self._lock:
            self._samples.append(sample)

    def drain(self) -> list[EngineSample]:
        """Everything kept since the last drain."""
        with self._lock:
            taken, self._samples = self._samples, []
        return taken


class StepClock:
    """Times an engine's steps (its forward passes) the same way for every engine.

    A step lasts from the later of the previous step's end and the moment work arrived at an idle engine, to the
    moment the engine reports it: time an engine spends waiting for work is outside every step, and so counts
    against its busy fraction (lab.metrics.steps), not its seconds per step. ``arrive`` and ``leave`` bracket one
    unit of work (a request, or HF's batch); ``step`` is called by whatever thread sees a step end.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._since: float | None = None

    def arrive(self, now: float) -> None:
        """Work arrived; an idle engine's next step starts now."""
        with self._lock:
            if self._held == 0:
                self._since = now
            self._held += 1

    def leave(self) -> None:
        """A unit of work ended."""
        with self._lock:
            self._held = max(0, self._held - 1)

    def step(self, now: float) -> float | None:
        """The step that ended at ``now`` took this long; None when no work ever arrived."""
        with self._lock:
            began, self._since = self._since, now
        return None if began is None else max(0.0, now - began)


@dataclass
class EngineInfo:
    """What an engine reports about itself after start()."""

    name: str
    args: dict = field(default_factory=dict)
    kv_bytes_per_token: int | None = None
    kv_total_blocks: int | None = None
    kv_block_size: int | None = None
    memory_bytes: int | None = None
    attention: str | None = None


@runtime_checkable
class Engine(Protocol):
    """The async protocol between the load driver and an engine."""

    name: str
    info: EngineInfo | None  # what start() returned (None before it): a ladder reads a rung's args here

    async def start(self) -> EngineInfo:
        """Load the model and get ready; returns what was loaded."""

    def check(self, request: GenRequest) -> str | None:
        """Return why the request cannot run (e.g. too long), or None."""

    def stream(self, request: GenRequest) -> AsyncIterator[TokenChunk]:
        """Run one request, yielding its tokens as they are made."""

    def drain_samples(self) -> list[EngineSample]:
        """Stats samples taken since the last call."""

    async def reset(self) -> None:
        """Forget cached state (prefix cache) between runs."""

    async def abort_all(self) -> None:
        """Stop work in flight as soon as possible (cancel)."""

    async def stop(self) -> None:
        """Release the model and any processes."""

    def alive(self) -> bool:
        """Whether the engine can still serve (vLLM's engine process, HF's worker thread)."""

    def fault(self) -> str | None:
        """Why it cannot serve, or why its work failed since the last reset, in plain words; None when fine."""

    def decode(self, token_ids: list[int]) -> str:
        """Turn output token ids into text."""


class LocalEngine:
    """What every adapter that loads the model itself shares: its settings, its samples and the length check."""

    def __init__(self, config, model_path: str):
        self.config = config
        self.model_path = model_path
        self._samples = SampleBuffer()
        self.info: EngineInfo | None = None

    def check(self, request: GenRequest) -> str | None:
        return check_fits(request, self.config.max_model_len)

    def admit(self, request: GenRequest) -> None:
        """Raise RequestRejected, with the reason, for a request this engine cannot run."""
        problem = self.check(request)
        if problem:
            raise RequestRejected(problem)


def check_fits(request: GenRequest, max_model_len: int) -> str | None:
    """The max_model_len wall, worded the same for every engine.

    Args:
        request: The request to check.
        max_model_len: Prompt + output tokens one request may hold.

    Returns:
        A message naming both lengths when the request does not fit, else None.
    """
    if request.prompt_len >= max_model_len:
        return (
            f"prompt has {request.prompt_len} tokens, but max_model_len is {max_model_len} "
            f"(the prompt plus at least one output token must fit)"
        )
    total = request.prompt_len + request.max_tokens
    if total > max_model_len:
        return (
            f"prompt of {request.prompt_len} tokens + {request.max_tokens} output tokens = {total} "
            f"tokens exceeds max_model_len {max_model_len}"
        )
    return None


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """Bytes of K and V one token occupies across all layers: 2 x layers x kv_heads x head_dim x dtype.

    Args:
        model_config: An HF model config (object or config.json dict; a multimodal one's text_config
            is used).
        dtype: 'bfloat16', 'float16' or 'float32'.

    Returns:
        Bytes per token of KV cache.
    """
    return kv_bytes_per_token_formula(model_config, dtype)[0]


def kv_bytes_per_token_formula(model_config, dtype: str) -> tuple[int, str]:
    """kv_bytes_per_token, with its formula written out in the model's numbers (for the waste experiment)."""
    def get(name):
        if isinstance(model_config, dict):
            return model_config.get(name)
        return getattr(model_config, name, None)

    text = get("text_config")
    if text is not None:
        return kv_bytes_per_token_formula(text, dtype)
    heads = get("num_attention_heads")
    head_dim = get("head_dim") or get("hidden_size") // heads
    kv_heads = get("num_key_value_heads") or heads
    layers, size = get("num_hidden_layers"), DTYPE_BYTES[dtype]
    total = 2 * layers * kv_heads * head_dim * size
    return total, (f"2 (K and V) x {layers} layers x {kv_heads} KV heads x {head_dim} head dim x {size} bytes "
                   f"({dtype}) = {total:,} bytes per token")
