"""Serve mode on the embedded model: the lab starts vLLM's and transformers' OpenAI servers and load-tests
them through the `openai` engine (lab.serve, lab.engines.openai)."""

import asyncio
import json
import threading

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan, parse_endpoint
from lab.model import resolve_model
from lab.runs import summary_dict
from lab.session import LabSession, check_session

pytestmark = pytest.mark.slow
KEY = "sk-kvlab-test"
CONFIG = EngineConfig(device="cpu")


@pytest.fixture(scope="module")
def servers():
    """A vLLM server (with an API key) and a transformers server, started side by side."""
    from lab.serve import start_server, stop

    path, started = resolve_model(None), {}

    def launch(engine, key):
        started[engine] = start_server(engine, CONFIG, path, api_key=key)

    threads = [threading.Thread(target=launch, args=args) for args in (("vllm", KEY), ("hf", None))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    yield started
    for server in started.values():
        stop(server)


def endpoint_config(server, key=None, name="openai"):
    return CONFIG.with_overrides(endpoints=(parse_endpoint(f"{name}={server.url}", server.model, key),))


def run(config, engines, load):
    """Start a session on the endpoints, run the plan, stop; returns (session, result)."""
    plan = RunPlan(engines=engines, load=load, engine=config)

    async def go():
        session = LabSession(config, engines)
        await session.start()
        try:
            return session, await session.run(plan)
        finally:
            await session.stop()

    return asyncio.run(go())


def test_vllm_server_exact_counts_and_kv_from_its_metrics(servers, tmp_path):
    # 48 tokens: each level lasts several of the 4-a-second /metrics reads. Under CI's load a server can answer
    # none of them while a level runs: that level's peak is then None (not read), never 0
    load = LoadConfig(users=(1, 5), requests_per_user=1, output_len=48, warmup_requests=1)
    session, result = run(endpoint_config(servers["vllm"], KEY), ("openai",), load)
    assert result.status == "ok"
    assert session.info["openai"].args["dialect"] == "token-ids" and session.info["openai"].args["metrics"]
    for level in result.levels:
        assert [r.output_tokens for r in level.records] == [48] * level.users
        assert level.kv["num_blocks"] == 91 and level.kv["peak_usage"] != 0  # read from /metrics
        assert level.kv["prefix_cache_queries"] <= sum(r.prompt_tokens for r in level.records)  # this level's only
    assert max(level.kv["peak_usage"] or 0 for level in result.levels) > 0
    assert max(level.kv["prefix_cache_queries"] for level in result.levels) > 0  # counted from the level's start
    summary = json.dumps(summary_dict(result))
    assert KEY not in summary and servers["vllm"].url in summary  # the key is never stored


def test_transformers_server_exact_counts_without_metrics(servers):
    load = LoadConfig(users=(1, 5), requests_per_user=1, output_len=8, warmup_requests=0)
    session, result = run(endpoint_config(servers["hf"]), ("openai",), load)
    assert result.status == "ok"
    assert session.info["openai"].args["dialect"] == "transformers" and not session.info["openai"].args["metrics"]
    assert [len(lvl.records) for lvl in result.levels] == [1, 5]
    assert all(r.output_tokens == 8 for lvl in result.levels for r in lvl.records)
    assert all(lvl.kv == {} for lvl in result.levels)  # no /metrics: no KV figures, said in engine args


def test_two_servers_compare_like_two_engines(servers):
    config = CONFIG.with_overrides(endpoints=(
        parse_endpoint(f"hfserve={servers['hf'].url}", servers["hf"].model),
        parse_endpoint(f"vllmserve={servers['vllm'].url}", servers["vllm"].model, KEY)))
    load = LoadConfig(users=(2,), requests_per_user=1, output_len=8, warmup_requests=0)
    session, result = run(config, ("hfserve", "vllmserve"), load)
    summary = summary_dict(result)
    assert set(summary["ratios"]) == {"vllmserve/hfserve"} and summary["ratios"]["vllmserve/hfserve"]["2"] > 0
    assert any("cannot be compared" in (pair.get("skipped") or "") for pair in summary["agreement"])


def test_wrong_url_or_key_is_refused_before_the_run(servers):
    with pytest.raises(ValueError, match="nothing answers at http://127.0.0.1:9"):
        check_session(CONFIG.with_overrides(endpoints=(parse_endpoint("http://127.0.0.1:9"),)), ("openai",))
    with pytest.raises(ValueError, match="refused the API key \\(HTTP 401\\)"):
        check_session(endpoint_config(servers["vllm"], "sk-wrong"), ("openai",))
    assert parse_endpoint(servers["vllm"].url + "/v1/", None, KEY).base_url == servers["vllm"].url  # the SDK's form
    with pytest.raises(ValueError, match="not an OpenAI-compatible server"):
        wrong_path = parse_endpoint(servers["vllm"].url + "/v2", None, KEY)
        check_session(CONFIG.with_overrides(endpoints=(wrong_path,)), ("openai",))


def test_a_server_killed_mid_run_gives_errors_and_keeps_the_rest(servers):
    from lab.serve import kill

    config, server = endpoint_config(servers["vllm"], KEY), servers["vllm"]
    load = LoadConfig(users=(4,), requests_per_user=2, output_len=64, warmup_requests=0)
    plan = RunPlan(engines=("openai",), load=load, engine=config)

    seen = {}

    def kill_after_first(result):
        done = sum(len(lvl.records) for lvl in result.levels)
        if done >= 1 and not seen:
            seen["at"] = done
            kill(server)

    async def go_kill():
        session = LabSession(config, ("openai",))
        await session.start()
        try:
            return await session.run(plan, kill_after_first)
        finally:
            await session.stop()

    result = asyncio.run(go_kill())
    records = result.levels[0].records
    assert result.status == "ok" and len(records) == 8  # the run went on
    ok = [r for r in records if r.status == "ok"]
    errors = [r for r in records if r.status == "error"]
    assert ok and all(r.output_tokens == 64 for r in ok)  # what finished before the kill is kept
    assert errors and all(server.url in r.error or "Error" in r.error for r in errors)
