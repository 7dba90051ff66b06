"""The dashboard's pure loaders: form input to a RunPlan, progress lines, live views, the Environment text."""

import asyncio

import pytest

from lab.app.dashboard import (
    BOUND_REQUESTS,
    BOUND_SECONDS,
    environment_markdown,
    over_time_view,
    per_level_view,
    plan_from_inputs,
    progress_text,
)
from lab.config import EngineConfig
from lab.engines.fake import FakeEngine
from lab.environment import GIB
from lab.runs import execute, summary_dict
from tests.test_driver import fake_result
from tests.test_plots import KVFake, empty_run, fake_run, plan
from tests.test_store import cancelled_run


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)


def form(engines=("hf", "vllm"), users="1,5", workload="mixed", output_len=0, bound=BOUND_REQUESTS,
         amount=2, max_model_len=2048, repeats=1, rate=0):
    """plan_from_inputs with the form's usual values, some changed."""
    config = EngineConfig(max_model_len=max_model_len)
    return plan_from_inputs(config, engines=None if engines is None else list(engines), users=users,
                            workload=workload, output_len=output_len, bound=bound, amount=amount, repeats=repeats,
                            rate=rate)


def test_valid_inputs_make_a_plan():
    plan = form(users=" 1, 5 10", output_len=0, amount=3.0)
    assert plan.engines == ("hf", "vllm") and plan.engine.max_model_len == 2048
    assert plan.load.users == (1, 5, 10) and plan.load.workload == "mixed"
    assert plan.load.requests_per_user == 3 and plan.load.duration_s is None and plan.load.output_len is None
    timed = form(engines=["vllm"], workload="decode", output_len=64.0, bound=BOUND_SECONDS, amount=2.5)
    assert timed.engines == ("vllm",) and timed.load.output_len == 64
    assert timed.load.duration_s == 2.5 and timed.load.requests_per_user is None


@pytest.mark.parametrize("changes, named", [
    (dict(engines=()), ["engines"]),
    (dict(engines=None), ["engines"]),
    (dict(users="0"), ["users", "0"]),
    (dict(users=""), ["users"]),
    (dict(users="a"), ["'a'"]),
    (dict(output_len=600, max_model_len=1024), ["600", "1024"]),
    (dict(amount=None), ["Requests per user"]),
    (dict(amount=None, bound=BOUND_SECONDS), ["Seconds per level"]),
    (dict(amount=0), ["Requests per user", "0"]),
    (dict(amount=0.5), ["Requests per user", "whole number", "0.5"]),
    (dict(amount=0, bound=BOUND_SECONDS), ["Seconds per level", "0"]),
    (dict(repeats=1.5), ["Repeats", "whole number", "1.5"]),
    (dict(repeats=0), ["Repeats", "1 to 10", "0"]),
    (dict(repeats=11), ["Repeats", "1 to 10", "11"]),
    (dict(repeats=None), ["Repeats", "nothing"]),
    (dict(output_len=None), ["Output length", "nothing"]),
    (dict(output_len=1.5), ["Output length", "whole number", "1.5"]),
    (dict(amount=100000, bound=BOUND_SECONDS), ["Seconds per level", "3600", "an hour", "55 h 33 min"]),
    (dict(rate=-3), ["Open loop: requests/s (0 = closed loop)", "give 0 for a closed loop", "-3"]),
    (dict(rate=20000), ["Open loop", "at most 10000", "20000"]),
])
def test_bad_inputs_say_what_is_wrong(changes, named):
    with pytest.raises(ValueError) as error:
        form(**changes)
    for word in named:
        assert word in str(error.value)


def test_progress_text_through_a_run(char_tokenizer):
    assert progress_text(None).startswith("No run yet")
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")}
    result = fake_result(plan(), engines)
    assert progress_text(result) == f"Running {result.id}: starting"
    lines = []
    asyncio.run(execute(result.plan, engines, char_tokenizer, result, lambda r: lines.append(progress_text(r))))
    assert f"Running {result.id}: warming up hf" in lines
    assert any("**vLLM** at **2** users, 3/4 requests done in this level" in line for line in lines)
    assert progress_text(result) == f"Run {result.id} done: 12 requests finished."


def test_progress_text_of_a_cancelled_run_counts_what_the_table_counts(char_tokenizer):
    from lab.plots import latency_table

    result = cancelled_run(char_tokenizer)
    finished = int(latency_table(summary_dict(result))["done"].sum())  # the table's "done": completed requests
    started = sum(len(lvl.records) for lvl in result.levels)
    text = progress_text(result)
    assert text.startswith(f"Run {result.id} cancelled") and f": {finished} requests finished" in text
    cancelled = sum(r.status == "cancelled" for lvl in result.levels for r in lvl.records)
    failed = started - finished - cancelled
    assert (f"{cancelled} stopped by the cancel" in text) == (cancelled > 0)
    assert (f"{failed} failed" in text) == (failed > 0)
    assert "stopped or failed" not in text


@pytest.mark.parametrize("finished", [True, False])
def test_the_views_of_a_run(char_tokenizer, finished):
    result = fake_run(char_tokenizer, engine=KVFake) if finished else empty_run()
    over, level = over_time_view(result), per_level_view(result)
    assert over.progress == progress_text(result)
    assert len(level.latency) == (4 if finished else 0)
    traces = [len(over.throughput.data), len(over.vllm_kv.data), len(over.kv_tokens.data), len(over.queue.data)]
    assert traces == ([4, 2, 4, 4] if finished else [0, 0, 0, 0])  # throughput: 2 engines x 2 levels
    assert (len(level.bars.data), len(level.ratio.data)) == ((2, 1) if finished else (0, 0))  # empty states


def environment():
    """A dict shaped like lab.app.host.LabHost.environment()."""
    engine = dict(args={}, attention=None, kv_total_blocks=None, kv_block_size=None, kv_bytes_per_token=None,
                  memory_bytes=None)
    return {
        "device": {"kind": "cuda", "name": "NVIDIA H100", "total_bytes": 80 * GIB, "free_bytes": 60 * GIB,
                   "cores": 16, "source": "NVML", "extra": {}},
        "versions": {"python": "3.12.1", "torch": "2.5.1", "vllm": "0.8.0"},
        "model": {"name": "SmolLM2-135M-Instruct", "location": "/models/smol", "weights_bytes": 256 * 2**20},
        "memory_plan": {"notes": ["vLLM takes half the card"]},
        "engines": {
            "hf": {**engine, "attention": "sdpa", "memory_bytes": 256 * 2**20},
            "vllm": {**engine, "attention": "FlashAttention", "kv_total_blocks": 1000, "kv_block_size": 16},
        },
        "agreement": None,
        "health": {"hf": {"state": "alive", "reason": "", "last_start_s": 4.2},
                   "vllm": {"state": "dead", "reason": "vLLM's engine process exited (signal 9, SIGKILL)",
                            "last_start_s": 27.0}},
        "process_rss_bytes": 900 * 2**20,
        "load_status": "ready",
    }


def test_environment_markdown():
    text = environment_markdown(environment())
    assert ("**Device:** NVIDIA H100 (cuda), 80.0 GiB total, 60.0 GiB free (read via NVML), 16 CPU cores"
            in text)
    assert "**Model:** SmolLM2-135M-Instruct — 256 MiB of weights at `/models/smol`" in text
    assert "**Versions:** python 3.12.1, torch 2.5.1, vllm 0.8.0" in text
    assert "**HF** (alive, last start 4 s): sdpa; holds 256 MiB of weights" in text
    assert ("**vLLM** (dead: vLLM's engine process exited (signal 9, SIGKILL), last start 27 s): FlashAttention; "
            "holds ? of KV-cache budget; KV at start-up: 1000 blocks x 16 tokens (16,000 token slots)" in text)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_workshop_demo_preset_is_a_valid_plan_and_says_why(device):
    from lab.presets import WORKSHOP_DEMO

    preset = WORKSHOP_DEMO[device]
    plan = preset.plan(EngineConfig(device="cpu"))
    assert plan.engines == ("hf", "vllm") and len(plan.load.users) >= 2
    assert "bench.workshop_demo" in preset.why


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_workshop_demo_stars_no_level(device):
    """Every level of each device's demo finishes at least TRUSTED_REQUESTS requests per engine over its repeats
    (users x requests per user x repeats), so thin_levels, which stars a level's ratio as noisy on the page, finds
    none."""
    from lab.metrics import TRUSTED_REQUESTS, thin_levels
    from lab.presets import WORKSHOP_DEMO

    load = WORKSHOP_DEMO[device].plan(EngineConfig(device="cpu")).load
    assert min(load.users) * load.requests_per_user * load.repeats >= TRUSTED_REQUESTS
    rows = [{"engine": engine, "users": users, "completed": users * load.requests_per_user}
            for engine in ("hf", "vllm") for users in load.users for _ in range(load.repeats)]
    assert thin_levels(rows) == []


def test_the_demo_button_fills_the_form_with_the_whole_preset_repeats_included():
    from lab.app.dashboard import LoadForm
    from lab.app.ui import Handlers
    from lab.presets import workshop_demo

    class ConfigHost:
        config = EngineConfig(device="cpu")

    values = LoadForm(*Handlers(ConfigHost()).demo_form())
    assert plan_from_inputs(ConfigHost.config, **vars(values)) == workshop_demo(ConfigHost.config).plan(
        ConfigHost.config)


def test_the_workshop_demo_bench_refuses_a_late_or_thin_candidate_and_picks_the_largest_top_ratio():
    from bench.workshop_demo import pick, refusal
    from lab.presets import DemoPreset

    old, short, late = (DemoPreset("1,4,8", "mixed", 24, 1), DemoPreset("1,4", "equal", 16, 4, 3),
                        DemoPreset("1,8", "decode", 24, 5, 2))
    assert refusal(35.0, [1, 4, 8], 120) == "  (not eligible: thin at 1, 4, 8 users)"
    assert refusal(130.0, [1], 120) == "  (not eligible: over the limit; thin at 1 users)"
    assert refusal(90.0, [], 120) == ""
    rows = [(old, 35.0, {1: 1.8, 8: 4.1}, [1, 4, 8]), (short, 70.0, {1: 1.5, 4: 2.0}, []),
            (late, 130.0, {1: 1.6, 8: 3.0}, [])]
    assert pick(rows, 120) == short
    assert pick(rows[:1], 120) is None


def test_a_room_of_pages_reads_and_fits_the_stored_runs_once_per_host_version(monkeypatch):
    """Every page redraws its estimate when a run ends: the stored runs are read and fitted once for all of them."""
    from types import SimpleNamespace

    from lab import estimate
    from lab.app import ui

    reads = []
    monkeypatch.setattr(estimate, "list_summaries", lambda db_path, limit: reads.append(db_path) or [])
    host = SimpleNamespace(version=1, db_path="db", health=lambda: {}, check=SimpleNamespace(
        model="m", memory=SimpleNamespace(device=SimpleNamespace(name="cpu-x"))))
    handlers = ui.Handlers(host)
    first = handlers.past()
    assert all(handlers.past() is first for _ in range(50)) and reads == ["db"]
    host.version = 2  # a run ended
    assert handlers.past() is not first and reads == ["db", "db"]
