"""The memory plan from the registry's facts: each engine's share by what its entry says it holds, the pool's sizing
policy recorded in the plan (and read back by the adapter and the plots, never re-derived there)."""

import pytest

from lab.config import EngineConfig
from lab.environment import GIB, DeviceInfo
from lab.memory import DEMO_SIZED, card_share, plan_memory, pool_blocks, shared_block

CPU = DeviceInfo("cpu", "CPU", 24 * GIB, 20 * GIB, 2, "test")
GPU = DeviceInfo("cuda", "H100", 80 * GIB, 80 * GIB, 16, "test")
PER_TOKEN = 23040  # SmolLM2-135M in bf16


def test_each_engine_gets_the_share_its_kind_plans_and_two_pools_are_counted_apart():
    plan = plan_memory(EngineConfig(device="cpu", dtype="bfloat16"), CPU, ("hf", "vllm", "vllm-engine"), GIB // 4,
                       PER_TOKEN)
    pool = GIB // 4 + GIB // 4  # its KV budget (0.25 GiB in bf16 on a CPU) + its own weights
    assert plan.shares == {"vllm": pool, "vllm-engine": pool, "hf": GIB // 4}
    assert plan.pools_bytes() == 2 * pool and plan.to_dict()["pools_bytes"] == 2 * pool
    assert "vLLM x2: vllm and vllm-engine each hold their own weights and KV pool" in plan.notes
    assert plan.pool_kv_tokens == GIB // 4 // PER_TOKEN and plan.pool_blocks is None


@pytest.mark.parametrize("config, blocks, sized_by", [
    (EngineConfig(device="cuda"), 1600, DEMO_SIZED),  # 64 users x (264 + 136) mean tokens of `mixed` / 16
    (EngineConfig(device="cuda", num_kv_blocks=7), 7, "set"),
    (EngineConfig(device="cuda", kv_cache_gib=2), None, None),
    (EngineConfig(device="cpu"), None, None),
])
def test_the_pool_sizing_lives_in_the_plan(config, blocks, sized_by):
    from lab.engines.vllm import engine_setup

    assert pool_blocks(config) == (blocks, sized_by)
    kwargs, sources = engine_setup(config, "m")  # the adapter's args and what it records: the same sizing
    assert (kwargs.get("num_gpu_blocks_override"), sources.get("num_kv_blocks")) == (blocks, sized_by)
    if config.resolved_device() == "cuda":
        plan = plan_memory(config, GPU, ("vllm",), GIB, PER_TOKEN)
        assert (plan.pool_blocks, plan.pool_sized_by) == (blocks, sized_by)
        assert blocks is None or plan.pool_kv_tokens == blocks * 16


def test_a_shared_budget_is_cut_in_the_devices_block_and_a_vllm_on_a_card_asks_for_its_share(monkeypatch):
    import lab.environment
    import lab.model

    assert (shared_block(EngineConfig(device="cpu")), shared_block(EngineConfig(device="cuda"))) == (32, 16)
    monkeypatch.setattr(lab.environment, "read_device", lambda kind: GPU)
    monkeypatch.setattr(lab.model, "weights_bytes", lambda path, dtype: 4 * GIB)
    budget = EngineConfig(device="cuda", kv_cache_gib=9)
    assert card_share(budget, "m").gpu_memory_utilization == round(16 / 80 + 0.01, 3)  # weights + pool + 3 GiB
    for config in (EngineConfig(device="cuda"), EngineConfig(device="cpu", kv_cache_gib=1)):
        assert card_share(config, "m") is config  # vLLM sizes its pool from gpu_memory_utilization; a CPU has no card
