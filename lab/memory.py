"""The memory planner: will the chosen engines fit on the device before anything loads, and what each holds.

vLLM's gpu_memory_utilization is a fraction of the device's TOTAL memory, not of what is free (the
seeds' gotcha on a shared card): the planner compares what it asks for against what NVML says is free,
and checks that what is left holds the other engines too. On CPU the same check runs against available RAM.
Each engine's share is planned by what its registry entry says it holds (``EngineSpec.memory``), never by its
name. The lab's sizing policy lives here too: the KV budget on a CPU and vLLM's default pool on a GPU (sized to the
Workshop demo), which the adapters read from this module and the plan records.
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
from lab.environment import GIB, DeviceInfo, gib
from lab.load.workloads import longest_request
from lab.metrics.kv import blocks_for

SLACK_BYTES = GIB // 2  # activations, CUDA context, allocator rounding
DEFAULT_CPU_KV_GIB = 0.25  # per 2 bytes of dtype: 91 blocks of 128, which a 20-user `mixed` run fills to ~2/3
DEMO_SIZED = "the Workshop demo's top level on average, computed"  # how a demo-sized pool is said


@dataclass(frozen=True)
class MemoryPlan:
    """What each engine will hold, and notes for the Environment view.

    Attributes:
        device: The device as read when planning.
        weights_bytes: The model's weights, if known.
        shares: Engine -> the bytes planned for it (what a restart of it frees); engines that hold nothing here
            are absent.
        notes: The plan in words.
        pool_kv_tokens: Token slots of each vLLM pool, where known before loading.
        pool_kv_bytes: KV bytes of each vLLM pool: the budget or the forced pool, else on a GPU its share less
            weights and slack.
        pool_blocks: The blocks each vLLM pool is forced to (num_kv_blocks, or the demo-sized default on a GPU);
            None where vLLM sizes it from its memory budget.
        pool_sized_by: Who sized that pool, in words ("set": num_kv_blocks; or DEMO_SIZED), else None.
        static_kv_bytes: The KV a static batch engine's worst batch would reserve (batch x max_model_len).
    """

    device: DeviceInfo
    weights_bytes: int | None
    shares: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    pool_kv_tokens: int | None = None
    pool_kv_bytes: int | None = None
    pool_blocks: int | None = None
    pool_sized_by: str | None = None
    static_kv_bytes: int | None = None

    def pools_bytes(self) -> int | None:
        """What every vLLM pool together asks for (weights + KV each), or None where none is planned."""
        found = [self.shares[n] for n in registry.with_pool(self.shares)]
        return sum(found) if found else None

    def to_dict(self) -> dict:
        return {
            "device_total_bytes": self.device.total_bytes, "device_free_bytes": self.device.free_bytes,
            "weights_bytes": self.weights_bytes, "shares": dict(self.shares), "pools_bytes": self.pools_bytes(),
            "static_kv_bytes": self.static_kv_bytes, "notes": list(self.notes),
            "pool_kv_tokens": self.pool_kv_tokens, "pool_kv_bytes": self.pool_kv_bytes,
            "pool_blocks": self.pool_blocks, "pool_sized_by": self.pool_sized_by,
        }


def kv_budget_bytes(config: EngineConfig) -> int | None:
    """The KV pool's bytes for vLLM (and HF-CB, given the same pool): kv_cache_gib, or the CPU default; None on a
    GPU without kv_cache_gib, where vLLM takes gpu_memory_utilization of the card (transformers: of free memory)."""
    size = config.kv_cache_gib
    if size is None and config.resolved_device() == "cpu":
        size = DEFAULT_CPU_KV_GIB * DTYPE_BYTES[config.resolved_dtype()] / 2  # float32: 0.5 GiB, the same blocks
    return None if size is None else int(size * GIB)


def demo_sized_blocks(config: EngineConfig) -> int | None:
    """vLLM's default pool on CUDA when no KV budget is set: the blocks the Workshop demo's top level holds on
    average (lab.presets.demo_pool_tokens), so that its KV plot shows the pool half full or more; None elsewhere."""
    from lab.presets import demo_pool_tokens

    if config.resolved_device() != "cuda" or config.kv_cache_gib is not None:
        return None
    return -(-demo_pool_tokens(config) // config.resolved_block_size())


def pool_blocks(config: EngineConfig) -> tuple[int | None, str | None]:
    """The blocks vLLM's pool is forced to (its num_gpu_blocks_override) and who sized it, in words: num_kv_blocks
    ("set"), else the demo-sized default on CUDA (DEMO_SIZED); (None, None) where vLLM sizes the pool from its memory
    budget. The one rule: every vLLM face takes its pool from here, and records who sized it in its engine args."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, "set"
    blocks = demo_sized_blocks(config)
    return blocks, (DEMO_SIZED if blocks is not None else None)


SHARED_BLOCK = {"cuda": 16, "cpu": 32}  # the block a KV budget shared by vLLM and HF-CB is cut in (vLLM's CPU build
# takes multiples of 32)
ACTIVATIONS_BYTES = 3 * GIB  # what a vLLM on a card needs beside its weights and pool (activations, CUDA graphs)


def shared_block(config: EngineConfig) -> int:
    """The block size of a KV budget several engines share (the why ladder's memory preset), on this device."""
    return SHARED_BLOCK["cuda" if config.resolved_device() == "cuda" else "cpu"]


def card_share(config: EngineConfig, model_path: str) -> EngineConfig:
    """A vLLM on CUDA with a set KV budget asks for the share of the card it takes (weights + pool + activations and
    graphs), not gpu_memory_utilization's: vLLM refuses to start unless that share is free, and the why ladder holds
    several vLLMs and HF models on one card at once. Elsewhere the config is returned as it is."""
    if config.resolved_device() != "cuda" or config.kv_cache_gib is None:
        return config
    from lab.environment import read_device
    from lab.model import weights_bytes

    need = (weights_bytes(model_path, config.resolved_dtype()) or 0) + config.kv_cache_gib * GIB + ACTIVATIONS_BYTES
    share = round(min(config.gpu_memory_utilization, need / read_device("cuda").total_bytes + 0.01), 3)
    return config.with_overrides(gpu_memory_utilization=share)


def capped_steps(config: EngineConfig, users: int) -> EngineConfig:
    """vLLM's settings with at most ``users`` requests in a step (the why ladder's offline rung, as many at once as
    its closed-loop rungs have users): its sequence cap, the user's or `vllm serve`'s (lab.engines.vllm_caps'
    batch_limits), bounded by ``users``."""
    from lab.engines.vllm_caps import batch_limits

    return config.with_overrides(max_num_seqs=min(batch_limits(config)["max_num_seqs"], users))


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


@dataclass
class _Planning:
    """The plan while it is made: each kind's planner adds its engines' shares and notes in turn."""

    config: EngineConfig
    device: DeviceInfo
    weights: int
    kv_per_token: int | None
    shares: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    pool: dict = field(default_factory=dict)

    def left(self) -> int:
        """What is free on the device after the shares planned so far."""
        return self.device.free_bytes - sum(self.shares.values())


def plan_memory(config: EngineConfig, device: DeviceInfo, engines: tuple[str, ...],
                weights_bytes: int | None, kv_per_token: int | None) -> MemoryPlan:
    """Check that the chosen engines fit, before anything loads: each kind of holding (the registry's
    ``memory``) in MEMORY_KINDS order, each planned on what the ones before it left.

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
    planning = _Planning(config, device, weights_bytes or 0, kv_per_token)
    for kind in registry.MEMORY_KINDS:
        names = [n for n in engines if registry.spec(n).memory == kind]
        if names:
            PLANNERS[kind](planning, names)
    static_kv = (config.hf_max_batch_size * config.max_model_len * kv_per_token) if kv_per_token else None
    return MemoryPlan(device, weights_bytes, planning.shares, planning.notes, static_kv_bytes=static_kv,
                      **planning.pool)


def plan_pools(planning: _Planning, names: list[str]) -> None:
    """vLLM pools: each its own weights and KV pool, from kv_cache_gib (or the CPU default) or, on a GPU without
    it, gpu_memory_utilization of the TOTAL memory; the pool forced to num_kv_blocks or the demo-sized default."""
    config, device, notes = planning.config, planning.device, planning.notes
    each, kv, kv_tokens = _pool_share(planning)
    blocks, sized_by = pool_blocks(config)
    if blocks is not None and planning.kv_per_token:
        size = config.resolved_block_size()
        kv_tokens = blocks * size
        kv = kv_tokens * planning.kv_per_token
        notes.append(f"vLLM's KV pool: {blocks:,} blocks of {size} tokens ({gib(kv)}), "
                     "set by num_kv_blocks or, on CUDA, sized to the Workshop demo's top level (lab/presets.py)")
    if len(names) > 1:
        notes.append(f"vLLM x{len(names)}: {' and '.join(names)} each hold their own weights and KV pool")
    total = each * len(names)
    if total > device.free_bytes:
        what = (f"gpu_memory_utilization={config.gpu_memory_utilization} is a fraction of the TOTAL "
                f"{gib(device.total_bytes)}, so it asks for {gib(total)}"
                if device.kind == "cuda" and config.kv_cache_gib is None
                else f"vLLM needs {gib(total)} (KV budget + weights)")
        fit = (device.free_bytes - SLACK_BYTES) / device.total_bytes if device.total_bytes else 0
        hint = (f"; use gpu_memory_utilization <= {fit:.2f}" if device.kind == "cuda" and fit > 0
                else "; lower kv_cache_gib")
        raise ValueError(f"{what}, but only {gib(device.free_bytes)} of {device.name} is free{hint}")
    planning.shares.update(dict.fromkeys(names, each))
    planning.pool.update(pool_kv_tokens=kv_tokens, pool_kv_bytes=kv, pool_blocks=blocks, pool_sized_by=sized_by)


def _pool_share(planning: _Planning) -> tuple[int, int, int | None]:
    """One vLLM's share (weights + KV), its KV bytes and KV token slots (None where unknown before loading)."""
    config, device, weights, per_token = planning.config, planning.device, planning.weights, planning.kv_per_token
    kv = kv_budget_bytes(config)
    if kv is not None:
        check_pool_holds_one(config, kv, per_token)
        planning.notes.append(f"vLLM: {gib(kv)} of KV cache + {gib(weights)} of weights")
        return int(kv + weights), kv, (int(kv // per_token) if per_token else None)
    share = int(config.gpu_memory_utilization * device.total_bytes)
    planning.notes.append(f"vLLM: gpu_memory_utilization {config.gpu_memory_utilization} x total "
                          f"{gib(device.total_bytes)} = {gib(share)} (weights + KV pages)")
    if share <= weights + SLACK_BYTES:
        raise ValueError(f"gpu_memory_utilization={config.gpu_memory_utilization} gives vLLM {gib(share)}, "
                         f"which does not even hold the {gib(weights)} of weights plus working memory: raise it")
    return share, max(0, share - weights - SLACK_BYTES), None


def plan_weights(planning: _Planning, names: list[str]) -> None:
    """Engines that hold their weights and grow their KV per batch (HF's static batches): the weights must fit in
    what is left; their worst static batch is noted, and warned about where it would not fit."""
    config, device, weights, per_token = planning.config, planning.device, planning.weights, planning.kv_per_token
    for name in names:
        label, left = registry.label(name), planning.left()
        if weights + SLACK_BYTES > left:
            raise ValueError(f"the {label} model needs {gib(weights)} of weights plus working memory, but only "
                             f"{gib(left)} are left on {device.name} after vLLM's share: lower vLLM's memory or the "
                             f"model size")
        planning.shares[name] = weights
        if per_token:
            worst = config.hf_max_batch_size * config.max_model_len * per_token
            planning.notes.append(f"{label}: {gib(weights)} of weights; its worst static batch "
                                  f"({config.hf_max_batch_size} x {config.max_model_len} tokens) would reserve "
                                  f"{gib(worst)} of contiguous KV")
            if weights + worst > left:
                planning.notes.append(f"warning: {label}'s worst-case batch would not fit in the {gib(left)} left; "
                                      f"large batches of long requests may run out of memory")


def plan_paged(planning: _Planning, names: list[str]) -> None:
    """Engines with a paged pool of their own (HF continuous batching): each its own copy of the weights, vLLM's KV
    budget, and the attention mask its SDPA path keeps (its step_tokens x (KV tokens + step_tokens), in the model's
    dtype). On a GPU without kv_cache_gib, transformers sizes its pool from what is free when it starts:
    only its weights are checked."""
    config, weights, per_token = planning.config, planning.weights, planning.kv_per_token
    kv = kv_budget_bytes(config) or 0
    tokens = kv // per_token if kv and per_token else 0
    for name in names:
        step = registry.spec(name).step_tokens
        mask = step * (tokens + step) * DTYPE_BYTES[config.resolved_dtype()] if tokens else 0
        label, left = registry.label(name), planning.left()
        planning.notes.append(f"{label}: {gib(weights)} of weights (its own copy) + "
                              + (f"{gib(kv)} of paged KV + {gib(mask)} of attention mask" if kv
                                 else "a paged KV pool transformers sizes from free memory"))
        if weights + kv + mask + SLACK_BYTES > left:
            raise ValueError(f"{label} needs {gib(weights + kv + mask)} (weights + KV + mask), but only {gib(left)} "
                             f"are left on {planning.device.name} after the other engines: lower kv_cache_gib or "
                             f"load fewer engines")
        planning.shares[name] = weights + kv + mask


PLANNERS = {"pool": plan_pools, "weights": plan_weights, "paged": plan_paged, "nothing": lambda planning, names: None}


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


def kv_fit_warning(plan: RunPlan, memory: MemoryPlan) -> str | None:
    """A warning when the largest user level's longest requests cannot all hold their KV in vLLM's pool.

    Args:
        plan: The run plan (user levels, workload, lengths).
        memory: The memory plan (vLLM's KV token slots, when known before loading).

    Returns:
        The warning in words, or None when they fit (or the pool size is known only after loading).
    """
    if not registry.with_pool(plan.engines) or memory.pool_kv_tokens is None:
        return None
    prompt, output = longest_request(plan.load.workload, plan.load.output_len)
    users = max(plan.load.users)
    needed = users * (prompt + output)
    if needed <= memory.pool_kv_tokens:
        return None
    return (f"at {users} users the {plan.load.workload!r} workload's longest requests ({prompt} + {output} tokens "
            f"each) need up to {needed:,} KV token slots, but vLLM's KV budget holds about "
            f"{memory.pool_kv_tokens:,}: requests will wait in vLLM's queue or be preempted (raise --kv-cache-gib "
            f"to avoid it)")
