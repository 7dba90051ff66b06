"""memory: the memory planner as a view. What a vLLM memory setting buys, before anything loads.

vLLM's gpu_memory_utilization is a share of the device's TOTAL memory, not of what is free; what it
gives vLLM, less the weights and working memory, becomes KV blocks, and those bound how many requests
of max_model_len tokens can be in flight at once. On CPU the KV budget is given directly. Every input
is read now (NVML or /proc); the KV figures are the planner's arithmetic, shown beside the blocks vLLM
really allocated at start-up for the session's own setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.environment import read_device
from lab.memory import NULL_BLOCKS, model_kv_bytes_per_token, plan_memory
from lab.metrics.kv import blocks_for

ENGINES = ()  # the engines this experiment needs loaded


@dataclass(frozen=True)
class Params:
    """A setting to try: gpu_memory_utilization (GPU) or kv_cache_gib; block_size; max_model_len."""

    gpu_memory_utilization: float | None = None
    kv_cache_gib: float | None = None
    block_size: int | None = None
    max_model_len: int | None = None

    def config(self, base):
        """The session's config with this setting (EngineConfig validates every value)."""
        changes = {k: v for k, v in vars(self).items() if v is not None}
        return base.with_overrides(**changes)


def check(params: Params, config) -> None:
    """The setting itself must be valid (EngineConfig's rules, the CPU block-size rule); the planner's
    refusal is not an error here: it is what the experiment shows."""
    params.config(config).check_block_size()


async def run(session, params: Params, result, notify) -> None:
    """The plan for the setting: refused (with the reason) or what it buys."""
    config = params.config(session.config)
    config.check_block_size()
    device = read_device(session.check.device)
    per_token = model_kv_bytes_per_token(session.check.model_path, config.resolved_dtype())
    weights = session.check.memory.weights_bytes or 0
    fields = {"device": device.name, "total_bytes": device.total_bytes, "free_bytes": device.free_bytes,
              "weights_bytes": weights, "kv_bytes_per_token": per_token, "block_size": config.resolved_block_size(),
              "max_model_len": config.max_model_len, "setting": vars(params)}
    try:
        plan = plan_memory(config, device, ("hf", "vllm"), weights, per_token)  # both on one device
    except ValueError as exc:
        result.fields = {**fields, "refused": True, "reason": str(exc)}
        return
    kv = plan.pool_kv_bytes
    blocks = int(kv // (per_token * config.resolved_block_size())) if per_token else None
    per_request = blocks_for(config.max_model_len, config.resolved_block_size())
    at_once = max(0, blocks - NULL_BLOCKS) // per_request if blocks is not None else None
    loaded = session.info.get("vllm")
    result.fields = {**fields, "refused": False, "vllm_bytes": plan.pools_bytes(), "kv_bytes_planned": kv,
                     "kv_blocks_planned": blocks,
                     "max_len_requests_at_once": at_once,
                     "notes": plan.notes, "session_kv_blocks_measured": loaded.kv_total_blocks if loaded else None}
    notify(result)

