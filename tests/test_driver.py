"""The closed-loop driver and the run executor, on the fake engine (no model)."""

import asyncio
import itertools

import pytest

from lab.config import LoadConfig, RunPlan
from lab.engines.base import GenRequest
from lab.engines.fake import FakeEngine
from lab.load.driver import run_users
from lab.load.workloads import WORKLOADS, make_requests, sample_specs
from lab.runs import RunResult, execute, summary_dict, write_run
from lab.status import RequestStatus


def requests(n, tokens=4, prompt=8):
    return [GenRequest(f"r{i}", tuple(range(prompt)), tokens) for i in range(n)]


class ConcurrencyProbe(FakeEngine):
    """Counts how many requests are in flight at once."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.now = self.peak = 0

    async def stream(self, request):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            async for chunk in super().stream(request):
                yield chunk
        finally:
            self.now -= 1


def test_closed_loop_keeps_exactly_n_users_in_flight():
    engine = ConcurrencyProbe(token_delay_s=0.001)
    records = asyncio.run(run_users(engine, iter(requests(20)), users=5))
    assert len(records) == 20 and engine.peak == 5
    assert all(r.status == RequestStatus.OK and r.output_tokens == 4 for r in records)
    assert {r.user_id for r in records} == set(range(5))


def test_each_user_waits_for_its_previous_request():
    engine = FakeEngine(token_delay_s=0.002)
    records = asyncio.run(run_users(engine, iter(requests(6)), users=2))
    for user in (0, 1):
        mine = sorted((r for r in records if r.user_id == user), key=lambda r: r.send_s)
        assert all(a.end_s <= b.send_s for a, b in itertools.pairwise(mine))


def test_errors_are_data_and_the_level_goes_on():
    engine = FakeEngine(error_rate=0.5, seed=1)
    too_long = GenRequest("long", tuple(range(3000)), 4)
    records = asyncio.run(run_users(engine, iter(requests(10) + [too_long]), users=3))
    assert len(records) == 11
    errors = [r for r in records if r.status == RequestStatus.ERROR]
    assert errors and any(r.status == RequestStatus.OK for r in records)
    long_record = next(r for r in records if r.request_id == "long")
    assert "3000" in long_record.error and "2048" in long_record.error


def test_duration_bound_stops_sending():
    engine = FakeEngine(token_delay_s=0.01)
    endless = (GenRequest(f"r{i}", (1, 2), 2) for i in range(10**6))
    records = asyncio.run(run_users(engine, endless, users=2, duration_s=0.2))
    assert 2 <= len(records) < 100


def test_cancel_keeps_what_was_measured():
    engine = FakeEngine(token_delay_s=0.01)
    seen = []

    async def main():
        task = asyncio.ensure_future(run_users(engine, iter(requests(100, tokens=10)), 4, on_record=seen.append))
        await asyncio.sleep(0.35)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert any(r.status == RequestStatus.OK for r in seen)
    cancelled = [r for r in seen if r.status == RequestStatus.CANCELLED]
    assert len(cancelled) == 4 and all(r.end_s is not None for r in cancelled)


def test_workloads_are_seeded_and_exact(char_tokenizer):
    for name, preset in WORKLOADS.items():
        a = make_requests(char_tokenizer, name, 30, seed=3)
        b = make_requests(char_tokenizer, name, 30, seed=3)
        assert a == b
        for r in a:
            if preset.fixed_prompt is None:
                assert preset.prompt_len[0] <= r.prompt_len <= preset.prompt_len[1]
            assert preset.output_len[0] <= r.max_tokens <= preset.output_len[1]
            assert r.ignore_eos
    assert sample_specs("mixed", 5, 1) != sample_specs("mixed", 5, 2)
    assert all(s.output_len == 7 for s in sample_specs("decode", 5, 1, output_len=7))


def fake_result(plan, engines):
    result = RunResult(plan=plan, model="fake", model_path="fake", device={"kind": "cpu"}, versions={})
    for name, engine in engines.items():
        result.engine_info[name] = asyncio.run(engine.start())
    return result


def test_execute_interleaves_levels_and_writes_files(tmp_path, char_tokenizer, monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")}
    plan = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 3), requests_per_user=2, output_len=5))
    events = []
    result = fake_result(plan, engines)
    asyncio.run(execute(plan, engines, char_tokenizer, result,
                        lambda r: events.append("complete" if r.ended_at else "update" if events else "start")))
    assert result.status == "ok"
    assert [(lvl.engine, lvl.users) for lvl in result.levels] == [("hf", 1), ("vllm", 1), ("hf", 3), ("vllm", 3)]
    assert [len(lvl.records) for lvl in result.levels] == [2, 2, 6, 6]
    assert all(r.output_tokens == 5 for lvl in result.levels for r in lvl.records)
    assert events[0] == "start" and events[-1] == "complete" and "update" in events
    summary = summary_dict(result)
    assert set(summary["ratio"]) == {"1", "3"}
    for run in summary["runs"]:
        for key in ("engine", "users", "requests", "errors", "output_tok_s", "total_tok_s", "ttft_s", "tpot_s",
                    "e2e_s"):
            assert key in run
        assert set(run["e2e_s"]) == {"mean", "p50", "p90", "p99"}
    paths = write_run(result, tmp_path / "out")
    assert paths["summary"].exists() and len(paths["requests"].read_text().splitlines()) == 17


def test_a_failing_engine_keeps_partial_results(tmp_path, char_tokenizer, monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)

    class Breaks(FakeEngine):
        async def reset(self):
            if self.name == "vllm" and getattr(self, "levels", 0) >= 1:
                raise RuntimeError("engine died")
            self.levels = getattr(self, "levels", 0) + 1

    engines = {"hf": Breaks("hf"), "vllm": Breaks("vllm")}
    plan = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 2), requests_per_user=1, warmup_requests=0))
    result = fake_result(plan, engines)
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    assert result.status == "failed" and "engine died" in result.error
    assert len(result.levels) >= 1 and result.levels[0].records
    write_run(result, tmp_path)
    assert "engine died" in (tmp_path / "summary.json").read_text()


def test_an_engine_that_dies_mid_level_fails_the_level_and_the_run_in_plain_words(char_tokenizer, monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)

    class Dies(FakeEngine):
        async def stream(self, request):
            async for chunk in super().stream(request):
                yield chunk
                if self.name == "vllm" and len(self._samples) > 20:  # some tokens made, then the process dies
                    self.failure = "vLLM's engine process exited (signal 9, SIGKILL)"

    engines = {"hf": Dies("hf"), "vllm": Dies("vllm", token_delay_s=0.01)}
    plan = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(2, 4), requests_per_user=4, output_len=30,
                                                           warmup_requests=0))
    result = fake_result(plan, engines)
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    assert result.status == "failed"
    assert result.error == "vLLM's engine process exited (signal 9, SIGKILL), during the 2-user level of vllm"
    assert [(lvl.engine, lvl.status) for lvl in result.levels] == [("hf", "ok"), ("vllm", "failed")]
    dead = result.levels[-1]
    assert dead.error.startswith("vLLM's engine process exited") and dead.records  # what it measured is kept
    assert any(r.output_tokens for r in dead.records)
    assert summary_dict(result)["runs"][-1]["status"] == "failed"


def test_a_dead_engine_fails_the_run_before_its_level_starts(char_tokenizer, monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)
    engines = {"vllm": FakeEngine("vllm")}
    engines["vllm"].failure = "vLLM's engine process exited (exit code 1)"
    plan = RunPlan(engines=("vllm",), load=LoadConfig(users=(1,), requests_per_user=1))  # with its warm-up
    result = fake_result(plan, engines)
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    assert result.status == "failed"
    assert result.error == "vLLM's engine process exited (exit code 1), before the 1-user level of vllm"
    assert not result.levels


def test_open_loop_sends_at_the_scheduled_times():
    from lab.load.arrivals import schedule_s
    from lab.load.driver import run_open

    times = list(itertools.islice(schedule_s(20.0, "poisson", seed=3), 10))
    assert times == list(itertools.islice(schedule_s(20.0, "poisson", seed=3), 10))  # seeded
    records = asyncio.run(run_open(FakeEngine(token_delay_s=0.001), iter(requests(10)), iter(times), cap=10))
    by_id = sorted(records, key=lambda r: int(r.request_id[1:]))
    start = by_id[0].scheduled_s
    assert [r.scheduled_s - start for r in by_id] == pytest.approx(times, abs=1e-9)  # the schedule, not the speed
    assert all(r.send_s >= r.scheduled_s for r in by_id)


def test_open_loop_cap_makes_due_requests_wait_in_the_client():
    from lab.load.arrivals import schedule_s
    from lab.load.driver import run_open
    from lab.metrics import queue_s

    engine = ConcurrencyProbe(token_delay_s=0.02)
    records = asyncio.run(run_open(engine, iter(requests(6)), schedule_s(1000.0, "constant"), cap=2))
    assert engine.peak == 2 and len(records) == 6
    assert max(queue_s(r) for r in records) > 0.05  # the last ones waited for a slot


def test_arrival_processes_have_the_asked_rate():
    from lab.load.arrivals import gaps_s

    for arrival, burstiness in (("poisson", 1.0), ("constant", 1.0), ("gamma", 0.5)):
        gaps = list(itertools.islice(gaps_s(4.0, arrival, burstiness, seed=1), 4000))
        assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.05), arrival
    bursty = list(itertools.islice(gaps_s(4.0, "gamma", 0.25, seed=1), 4000))
    even = list(itertools.islice(gaps_s(4.0, "gamma", 4.0, seed=1), 4000))
    assert max(bursty) > max(even)  # a small shape makes long gaps and bursts


def test_open_loop_level_reports_queue_and_goodput(char_tokenizer):
    engines = {"hf": FakeEngine("hf", token_delay_s=0.001)}
    plan = RunPlan(engines=("hf",), load=LoadConfig(users=(2,), requests_per_user=3, rate=50.0, warmup_requests=0,
                                                    slo=(("ttft", 10.0),)))
    result = fake_result(plan, engines)
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    summary = summary_dict(result)
    run = summary["runs"][0]
    assert run["slo_met"] == 6 and run["goodput_req_s"] == pytest.approx(run["req_s"])
    assert run["queue_s"]["p50"] is not None and summary["load"]["rate"] == 50.0
