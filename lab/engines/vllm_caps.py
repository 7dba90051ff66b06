"""vLLM's two step caps (max_num_batched_tokens, max_num_seqs) for a config: the user's, else what `vllm serve` gives
on this device, asked of vLLM itself. Apart from the adapter (lab.engines.vllm, which passes them to every face of
vLLM) so that the memory plan (lab.memory) can read them without importing the adapter.
"""

from __future__ import annotations

import functools

from lab.config import EngineConfig, batch_limits_clash

STEP_CAPS = ("max_num_batched_tokens", "max_num_seqs")  # the two caps vLLM sizes by device and usage context


def batch_limits(config: EngineConfig) -> dict[str, int]:
    """vLLM's two step caps for this config: each one the user set, else what `vllm serve` gives on this device.

    The one place every reader gets them from: engine_kwargs (so the served, step-loop and offline faces and
    ``lab serve`` run the same two) and any reader that needs a number before an engine exists (the why ladder's
    offline rung, capped at its users by lab.memory.capped_steps). Asked of vLLM because the lab's AsyncLLM and
    LLMEngine would otherwise get the fallback defaults of their own usage context, not the OpenAI server's, and
    vLLM's own table changes with the device and the release.

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
