"""Sweeps: every value validated before any restart; on the real engines, one restart per value."""


import pytest

from lab.config import EngineConfig, LoadConfig
from lab.status import RunStatus
from lab.sweeps import SweepPlan, SweepResult, parse_values, run_sweep, write_sweep
from tests.conftest import running_session

CPU = EngineConfig(device="cpu", max_model_len=512, kv_cache_gib=0.5)
LOAD = LoadConfig(users=(2,), requests_per_user=1, workload="equal", output_len=8, warmup_requests=1)


@pytest.mark.parametrize("knob, values, message", [
    ("block_size", (16, 32), "multiple of 32"),
    ("max_num_seqs", (0, 4), "max_num_seqs must be at least 1, not 0"),
    ("gpu_memory_utilization", (0.3,), "GPU knob"),
    ("kv_cache_gib", (0.25, 4096.0), "lower kv_cache_gib"),
    ("temperature", (1,), "unknown knob"),
    ("max_num_seqs", (), "at least one value"),
])
def test_every_value_is_checked_before_any_restart(knob, values, message):
    with pytest.raises(ValueError, match=message):
        SweepPlan(knob, values, LOAD).check(CPU)


def test_values_parse_with_the_knob_named():
    assert parse_values("max_num_seqs", "1,4 16") == (1, 4, 16)
    assert parse_values("kv_cache_gib", "0.25,0.5") == (0.25, 0.5)
    with pytest.raises(ValueError, match="hf_max_batch_size: '4,x' is not a list of whole numbers"):
        parse_values("hf_max_batch_size", "4,x")


def test_partial_sweep_is_written(tmp_path):
    result = SweepResult(plan=SweepPlan("max_num_seqs", (1, 4), LOAD), model="m", status=RunStatus.CANCELLED,
                         points=[{"value": 1, "restart_s": 3.0, "output_tok_s@2": 10.0}])
    paths = write_sweep(result, tmp_path)
    assert '"knob": "max_num_seqs"' in paths["json"].read_text()
    assert paths["csv"].read_text().splitlines() == ["value,restart_s,output_tok_s@2", "1,3.0,10.0"]


@pytest.fixture(scope="module")
def lab():
    """Both engines started once, on one event loop that every test of this module reuses."""
    yield from running_session(CPU)


@pytest.mark.slow
def test_kv_budget_sweep_restarts_vllm_only_and_changes_its_blocks(lab):
    hf_before = lab.engines["hf"]
    result = lab.loop.run_until_complete(run_sweep(lab, SweepPlan("kv_cache_gib", (0.25, 0.5), LOAD)))
    assert result.status == RunStatus.OK, result.error
    blocks = [p["kv_total_blocks"] for p in result.points]
    assert blocks[0] < blocks[1] and all(p["output_tok_s@2"] > 0 and p["restart_s"] > 0 for p in result.points)
    assert lab.engines["hf"] is hf_before  # the other engine stayed loaded
    assert lab.info["vllm"].kv_total_blocks == blocks[1]  # restored: the session's own 0.5 GiB


@pytest.mark.slow
def test_hf_batch_size_sweep_measures_each_value(lab):
    vllm_before = lab.engines["vllm"]
    result = lab.loop.run_until_complete(run_sweep(lab, SweepPlan("hf_max_batch_size", (1, 2), LOAD)))
    assert result.status == RunStatus.OK, result.error
    assert [p["value"] for p in result.points] == [1, 2]
    assert all(p["kv_peak_reserved_bytes@2"] > 0 and p["ttft_p50_s@2"] > 0 for p in result.points)
    assert lab.engines["vllm"] is vllm_before
