"""The memory planner: will both engines fit on the device before anything loads?

vLLM's gpu_memory_utilization is a fraction of the device's TOTAL memory, not of what is free (the
seeds' gotcha on a shared card): the planner compares what it asks for against what NVML says is free,
and checks that what is left holds the HF model too. On CPU the same check runs against available RAM.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from lab.config import EngineConfig, RunPlan
from lab.engines import registry
from lab.engines.base import DTYPE_BYTES, kv_bytes_per_token
from lab.engines.vllm import kv_budget_bytes, pool_blocks_override
from lab.environment import GIB, DeviceInfo, gib
from lab.load.workloads import longest_request
from lab.metrics.kv import blocks_for

SLACK_BYTES = GIB // 2  # activations, CUDA context, allocator rounding


@dataclass(frozen=True)
class MemoryPlan:
    """What each engine will hold, and notes for the Environment view."""

    device: DeviceInfo
    weights_bytes: int | None
    vllm_bytes: int | None
    hf_bytes: int | None
    hf_worst_kv_bytes: int | None
    notes: list[str] = field(default_factory=list)
    vllm_kv_tokens: int | None = None  # token slots of vLLM's KV budget, where it is known before loading
    vllm_kv_bytes: int | None = None  # KV bytes planned: the budget or the forced pool, else on a GPU its share less
    #                                   weights and slack
    hf_cb_bytes: int | None = None  # HF continuous batching: its own weights + its paged KV (when it is loaded)

    def to_dict(self) -> dict:
        return {
            "device_total_bytes": self.device.total_bytes, "device_free_bytes": self.device.free_bytes,
            "weights_bytes": self.weights_bytes, "vllm_bytes": self.vllm_bytes, "hf_bytes": self.hf_bytes,
            "hf_worst_kv_bytes": self.hf_worst_kv_bytes, "notes": list(self.notes),
            "vllm_kv_tokens": self.vllm_kv_tokens, "vllm_kv_bytes": self.vllm_kv_bytes,
        }


def local_config(model_path: str) -> dict:
    """A local folder's config.json (its text model's part where it has one); empty for hub ids and unreadable
    files, whose checks then fall to the engines."""
    config_file = Path(model_path) / "config.json"
    try:
        found = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError):
        return {}
    return found.get("text_config", found) if isinstance(found, dict) else {}


def model_kv_bytes_per_token(model_path: str, dtype: str) -> int | None:
    """Bytes of KV per token from a local folder's config.json (None for hub ids)."""
    try:
        return kv_bytes_per_token(local_config(model_path), dtype)
    except (TypeError, KeyError):  # a config without the usual attention fields
        return None


def check_model_len(config: EngineConfig, model_path: str) -> None:
    """The model's own limit on max_model_len (max_position_embeddings in a local folder's config.json), before
    anything loads: vLLM refuses a longer one at start, HF would compute positions it was never trained on. A
    config that scales its positions (rope_scaling) or vLLM told to allow a longer one is left to vLLM's rule."""
    found = local_config(model_path)
    limit = found.get("max_position_embeddings")
    if found.get("rope_scaling") or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    if isinstance(limit, int) and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} is longer than this model's {limit} tokens "
                         f"(max_position_embeddings in its config.json): use max_model_len <= {limit}")


def plan_memory(config: EngineConfig, device: DeviceInfo, engines: tuple[str, ...],
                weights_bytes: int | None, kv_per_token: int | None) -> MemoryPlan:
    """Check that the chosen engines fit, before anything loads.

    Args:
        config: The engine config (memory fraction or KV budget, batch size, max_model_len).
        device: The device as read now (free memory included).
        engines: The engines that will be loaded together.
        weights_bytes: The model's weights on disk, if known.
        kv_per_token: KV bytes per token, if known.

    Returns:
        The plan.

    Raises:
        ValueError: with the reason and a value that would fit, when the engines cannot fit.
    """
    weights = weights_bytes or 0
    notes = []
    hf_kv = (config.hf_max_batch_size * config.max_model_len * kv_per_token) if kv_per_token else None
    vllm_bytes = kv_tokens = kv = None
    vllm_count = len(registry.with_pool(engines))  # vllm and vllm-engine: a pool each
    if vllm_count:
        kv = kv_budget_bytes(config)
        if kv is not None:
            vllm_bytes = int(kv + weights)
            kv_tokens = int(kv // kv_per_token) if kv_per_token else None
            check_pool_holds_one(config, kv, kv_per_token)
            notes.append(f"vLLM: {gib(kv)} of KV cache + {gib(weights)} of weights")
        else:
            vllm_bytes = int(config.gpu_memory_utilization * device.total_bytes)
            notes.append(
                f"vLLM: gpu_memory_utilization {config.gpu_memory_utilization} x total "
                f"{gib(device.total_bytes)} = {gib(vllm_bytes)} (weights + KV pages)"
            )
            kv = max(0, vllm_bytes - weights - SLACK_BYTES)
            if vllm_bytes <= weights + SLACK_BYTES:
                raise ValueError(
                    f"gpu_memory_utilization={config.gpu_memory_utilization} gives vLLM {gib(vllm_bytes)}, "
                    f"which does not even hold the {gib(weights)} of weights plus working memory: raise it"
                )
        if (blocks := pool_blocks_override(config)) is not None and kv_per_token:
            size = config.resolved_block_size()
            kv_tokens = blocks * size
            kv = kv_tokens * kv_per_token
            notes.append(f"vLLM's KV pool: {blocks:,} blocks of {size} tokens ({gib(kv)}), "
                         "set by num_kv_blocks or, on CUDA, sized to the Workshop demo's top level (lab/presets.py)")
        if vllm_count > 1:
            vllm_bytes *= vllm_count
            notes.append(f"vLLM x{vllm_count}: vllm and vllm-engine each hold their own weights and KV pool")
        if vllm_bytes > device.free_bytes:
            what = (f"gpu_memory_utilization={config.gpu_memory_utilization} is a fraction of the TOTAL "
                    f"{gib(device.total_bytes)}, so it asks for {gib(vllm_bytes)}"
                    if device.kind == "cuda" and config.kv_cache_gib is None
                    else f"vLLM needs {gib(vllm_bytes)} (KV budget + weights)")
            fit = (device.free_bytes - SLACK_BYTES) / device.total_bytes if device.total_bytes else 0
            hint = (f"; use gpu_memory_utilization <= {fit:.2f}" if device.kind == "cuda" and fit > 0
                    else "; lower kv_cache_gib")
            raise ValueError(f"{what}, but only {gib(device.free_bytes)} of {device.name} is free{hint}")
    hf_bytes = None
    if "hf" in engines:
        hf_bytes = weights
        left = device.free_bytes - (vllm_bytes or 0)
        if weights + SLACK_BYTES > left:
            raise ValueError(
                f"the HF model needs {gib(weights)} of weights plus working memory, but only {gib(left)} "
                f"are left on {device.name} after vLLM's share: lower vLLM's memory or the model size"
            )
        if hf_kv is not None:
            notes.append(
                f"HF: {gib(weights)} of weights; its worst static batch ({config.hf_max_batch_size} x "
                f"{config.max_model_len} tokens) would reserve {gib(hf_kv)} of contiguous KV"
            )
            if weights + hf_kv > left:
                notes.append(
                    f"warning: HF's worst-case batch would not fit in the {gib(left)} left; large batches "
                    f"of long requests may run out of memory"
                )
    hf_cb = plan_hf_cb(config, device, weights, device.free_bytes - (vllm_bytes or 0) - (hf_bytes or 0), notes,
                       kv_per_token) \
        if "hf-cb" in engines else None
    return MemoryPlan(device, weights_bytes, vllm_bytes, hf_bytes, hf_kv, notes, kv_tokens, kv, hf_cb)


NULL_BLOCKS = 1  # vLLM keeps one block of its pool aside (its null block): no request's tokens go there


def least_blocks(config: EngineConfig) -> int:
    """The smallest pool vLLM starts with: one request of max_model_len tokens, plus its null block."""
    return blocks_for(config.max_model_len, config.resolved_block_size()) + NULL_BLOCKS


def check_pool_holds_one(config: EngineConfig, kv: int, kv_per_token: int | None) -> None:
    """vLLM's start-up rule, before it loads: its pool must hold least_blocks(config)."""
    block_bytes, least = (kv_per_token or 0) * config.resolved_block_size(), least_blocks(config)
    if block_bytes and kv // block_bytes < least:
        need = math.ceil(least * block_bytes / GIB * 1000) / 1000
        given = f"kv_cache_gib={kv / GIB:g}" + ("" if config.kv_cache_gib is not None else " (the default)")
        raise ValueError(f"{given} holds {kv // block_bytes} blocks of block_size={config.resolved_block_size()} "
                         f"tokens, fewer than one request of max_model_len={config.max_model_len} needs with vLLM's "
                         f"null block ({least}): use kv_cache_gib >= {need:g}, or a smaller max_model_len or "
                         f"block_size")


def plan_hf_cb(config: EngineConfig, device: DeviceInfo, weights: int, left: int, notes: list[str],
               kv_per_token: int | None = None) -> int:
    """HF continuous batching's share: its own copy of the weights, vLLM's KV budget, and the attention mask its
    SDPA path keeps (max_batch_tokens x (KV tokens + max_batch_tokens), in the model's dtype). On a GPU without
    kv_cache_gib, transformers sizes its pool from what is free when it starts: only its weights are checked."""
    from lab.engines.hf_cb import BATCH_TOKENS

    kv = kv_budget_bytes(config) or 0
    tokens = kv // kv_per_token if kv and kv_per_token else 0
    mask = BATCH_TOKENS * (tokens + BATCH_TOKENS) * DTYPE_BYTES[config.resolved_dtype()] if tokens else 0
    notes.append(f"HF-CB: {gib(weights)} of weights (its own copy) + "
                 + (f"{gib(kv)} of paged KV + {gib(mask)} of attention mask" if kv
                    else "a paged KV pool transformers sizes from free memory"))
    if weights + kv + mask + SLACK_BYTES > left:
        raise ValueError(f"HF continuous batching needs {gib(weights + kv + mask)} (weights + KV + mask), but only "
                         f"{gib(left)} are left on {device.name} after the other engines: lower kv_cache_gib or "
                         f"load fewer engines")
    return weights + kv + mask


def kv_fit_warning(plan: RunPlan, memory: MemoryPlan) -> str | None:
    """A warning when the largest user level's longest requests cannot all hold their KV in vLLM's pool.

    Args:
        plan: The run plan (user levels, workload, lengths).
        memory: The memory plan (vLLM's KV token slots, when known before loading).

    Returns:
        The warning in words, or None when they fit (or the pool size is known only after loading).
    """
    if "vllm" not in plan.engines or memory.vllm_kv_tokens is None:
        return None
    prompt, output = longest_request(plan.load.workload, plan.load.output_len)
    users = max(plan.load.users)
    needed = users * (prompt + output)
    if needed <= memory.vllm_kv_tokens:
        return None
    return (f"at {users} users the {plan.load.workload!r} workload's longest requests ({prompt} + {output} tokens "
            f"each) need up to {needed:,} KV token slots, but vLLM's KV budget holds about "
            f"{memory.vllm_kv_tokens:,}: requests will wait in vLLM's queue or be preempted (raise --kv-cache-gib "
            f"to avoid it)")
