"""The KV-cache experiments on the real engines (CPU, embedded model), small sizes; assert on what was measured."""

import asyncio
import json
import subprocess
import sys

import pytest

from lab.config import EngineConfig
from lab.engines.base import DTYPE_BYTES
from lab.experiments import EXPERIMENTS, parse_params, run_experiment, validate, write_experiment
from lab.status import RunStatus
from tests.conftest import running_session

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(device="cpu", kv_cache_gib=0.5)  # max_model_len 2048: the prefill preset's prompts fit
SHORT = EngineConfig(device="cpu", max_model_len=1024, kv_cache_gib=0.5)


@pytest.fixture(scope="module")
def lab():
    """Both engines started once, on one event loop that every test of this module reuses."""
    yield from running_session(CONFIG)


def experiment(lab, name, **values):
    params = parse_params(name, {k: str(v) for k, v in values.items()})
    result = lab.loop.run_until_complete(run_experiment(lab, name, params))
    assert result.status == RunStatus.OK, result.error
    return result


def test_waste_paged_blocks_waste_less_than_static_batches(lab, tmp_path):
    result = experiment(lab, "waste", users=8, output_len=24)
    hf, vllm = result.fields["hf"]["waste_pct"], result.fields["vllm"]["waste_pct"]
    assert 0 <= vllm["mean"] < hf["mean"] <= 100
    static = result.fields["hf-static"]  # every row reserved for the load's longest request, up front
    assert static["cache_tokens_per_row"] == 512 + 24 and static["kinds_pct"]["reservation"] > 0
    for name in ("hf", "hf-static", "vllm"):  # the kinds split each engine's held memory x time
        kinds = result.fields[name]["kinds_pct"]
        assert sum(kinds.values()) == pytest.approx(100, abs=0.05)
        assert kinds["internal"] + kinds["reservation"] + kinds["external"] == pytest.approx(
            result.fields[name]["waste_pct"]["mean"], abs=0.05)
    assert result.fields["vllm"]["kinds_pct"]["reservation"] == result.fields["hf"]["kinds_pct"]["reservation"] == 0
    assert static["kinds_pct"]["real"] < result.fields["hf"]["kinds_pct"]["real"]  # reserving ahead holds more
    per_token = 11520 * DTYPE_BYTES[lab.config.resolved_dtype()]  # 2 x 30 layers x 3 KV heads x 64 elements
    assert result.fields["bytes_per_token"] == per_token and "30 layers x 3 KV heads x 64" in \
        result.fields["bytes_per_token_formula"]
    paths = write_experiment(result, tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert saved["experiment"] == "waste" and saved["hf"]["waste_pct"]["mean"] == hf["mean"]
    assert {"model", "device", "engine_args", "versions", "params"} <= set(saved)
    assert paths["csv"].read_text().startswith("engine,time_s,held_tokens,real_tokens")
    assert {"hf", "hf-static", "vllm"} == {row["engine"] for row in result.rows}


def test_blocks_derived_picture_agrees_with_vllms_count(lab):
    result = experiment(lab, "blocks", users=4, output_len=24)
    assert result.fields["samples"] > 0 and result.fields["peak_used_blocks"] > 0
    assert result.fields["agree"] is True, result.rows
    assert result.fields["num_blocks"] > 0 and result.fields["block_size"] == 128


def test_prefix_constant_block_first_hits_the_cache(lab):
    result = experiment(lab, "prefix", requests=4, users=1, shared_tokens=256, unique_tokens=32, output_len=4,
                        repeats=2)
    first, last = result.fields["first"], result.fields["last"]
    assert first["hit_rate"] > 0.3 and last["hit_rate"] < 0.1 and first["hit_rate"] > last["hit_rate"]
    assert first["queried_tokens"] > 0 and first["ttft_p50_s"] > 0 and last["ttft_p50_s"] > 0
    assert first["computed"] == {"hit_tokens": 3 * 256, "hit_rate": 3 * 256 / (4 * 288), "full_blocks": 2}
    assert abs(first["hit_rate"] - first["computed"]["hit_rate"]) < 0.1 and last["computed"]["hit_tokens"] == 0
    assert result.fields["ttft_ratio_spread"]["n"] == 2 and {r["repeat"] for r in result.rows} == {0, 1}


def test_preemption_small_pool_preempts_normal_pool_does_not(lab):
    result = experiment(lab, "preemption", users=10, output_len=48)  # the least pool: 17 blocks
    assert result.fields["small"]["preemptions"] > 0 and result.fields["small"]["kv_blocks"] == 17
    assert result.fields["normal"]["preemptions"] == 0
    assert result.fields["small"]["completed"] == result.fields["normal"]["completed"] == 10
    assert "recompute" in result.fields["preemption_mode"]


def test_phases_decode_gains_more_from_users_than_prefill(lab):
    result = experiment(lab, "phases", users="1,3", decode_output_len=24)
    assert set(result.fields) == {"prefill", "decode"}
    for workload in ("prefill", "decode"):
        assert set(result.fields[workload]) == {"hf", "vllm"}
    assert result.fields["decode"]["vllm"]["gain"] > result.fields["prefill"]["vllm"]["gain"]


def test_memory_shows_the_arithmetic_and_the_refusal(lab):
    fine = experiment(lab, "memory", kv_cache_gib=0.5)
    assert fine.fields["refused"] is False
    assert fine.fields["kv_blocks_planned"] == fine.fields["session_kv_blocks_measured"]  # planner = vLLM
    refused = experiment(lab, "memory", kv_cache_gib=4096)
    assert refused.fields["refused"] is True and "kv_cache_gib" in refused.fields["reason"]


@pytest.mark.parametrize("name, values, message", [
    ("preemption", {"kv_blocks": "1"}, "cannot hold even one request"),
    ("prefix", {"shared_tokens": "2000"}, "max_model_len 1024"),
    ("waste", {"users": "0"}, ">= 1"),
    ("waste", {"output_len": "900"}, "max_model_len 1024"),
    ("memory", {"block_size": "48"}, "multiple of 32"),
    ("phases", {"users": "1,x"}, "not a list of whole numbers"),
    ("phases", {"users": "1,5"}, "max_model_len 1024"),  # the prefill preset's 1536-token prompts
])
def test_bad_parameters_are_refused_before_anything_runs(name, values, message):
    with pytest.raises(ValueError, match=message):
        validate(name, parse_params(name, values), SHORT)


def test_cli_experiment_exits_2_on_bad_input_before_loading(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lab", "experiment", "preemption", "--param", "kv_blocks=1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "kv_blocks=1" in proc.stderr
    assert set(EXPERIMENTS) >= {"waste", "blocks", "prefix", "phases", "preemption", "memory"}


def test_sharing_n_answers_share_the_prompts_blocks(lab):
    result = experiment(lab, "sharing", n=4, prompt_tokens=512, output_len=16)
    one, together = result.fields["one"], result.fields["n=4 in one request"]
    assert together["answers"] == 4 and together["output_tokens"] == 64
    assert 0 < one["peak_blocks"] and together["peak_blocks"] < result.fields["unshared_blocks_estimate"]
    assert result.fields["4 separate requests"]["answers"] == 4 and "beam search" in result.fields["beam_search"]


def test_a_cancelled_experiment_keeps_what_it_measured(lab):
    params = parse_params("waste", {"users": "4", "output_len": "64"})

    async def cancel_during_vllm():
        from lab.experiments import new_result

        result = new_result(lab, "waste", params)
        task = asyncio.ensure_future(run_experiment(lab, "waste", params, result))
        while not (result.run and any(lvl.engine == "vllm" for lvl in result.run.levels)):  # HF's level is done
            await asyncio.sleep(0.05)
        task.cancel()
        return await task

    result = lab.loop.run_until_complete(cancel_during_vllm())
    assert result.status == RunStatus.CANCELLED
    assert result.fields["hf"]["waste_pct"]["mean"] is not None  # the finished HF level's figures are kept
