"""The registry holds every engine fact the lab reads: ratio bases and colours, knobs, rungs, memory kinds."""

import pytest

from lab.engines import registry
from lab.engines.registry import EngineSpec


def test_the_ratio_bases_knobs_and_rungs_come_from_the_entries():
    assert registry.ratio_bases() == ("hf", "hf-cb")
    assert registry.knobs() == {"max_num_seqs": "vllm", "block_size": "vllm", "kv_cache_gib": "vllm",
                                "gpu_memory_utilization": "vllm", "hf_max_batch_size": "hf"}  # a pool's knobs first
    assert list(registry.rungs()) == ["hf", "hf-compiled", "hf-cb", "vllm-hf-code", "vllm-eager", "vllm-compiled",
                                      "vllm", "vllm-engine", "offline"]
    assert registry.rungs()["vllm-eager"].engine == "vllm" and registry.rungs()["offline"].engine == "offline"
    assert {n: s.memory for n, s in registry.ENGINES.items()} == {
        "hf": "weights", "vllm": "pool", "hf-cb": "paged", "vllm-engine": "pool", "openai": "nothing"}


def test_an_unknown_memory_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="memory 'disk' is not one of pool, weights, paged, nothing"):
        EngineSpec("x", "X", "m:C", "x", memory="disk")
