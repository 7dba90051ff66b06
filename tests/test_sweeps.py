"""Sweeps: every value validated before any restart; on the real engines, one restart per value."""


import pytest

from lab.config import EngineConfig, LoadConfig
from lab.plots.sweep import sweep_figure
from lab.status import RunStatus
from lab.store import list_sweeps, load_sweep, save
from lab.sweeps import (
    SweepPlan,
    SweepResult,
    default_values,
    parse_values,
    run_sweep,
    sweep_plan,
    sweep_progress,
    write_sweep,
)
from tests.conftest import running_session

CPU = EngineConfig(device="cpu", max_model_len=512, kv_cache_gib=0.5, block_size=128)
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


def test_form_text_makes_a_plan_and_every_knob_has_values_on_both_devices():
    plan = sweep_plan("hf_max_batch_size", "1, 2", users="2,4", requests_per_user=1, output_len=0)
    assert (plan.engine, plan.values, plan.load.users, plan.load.output_len) == ("hf", (1, 2), (2, 4), None)
    with pytest.raises(ValueError, match="unknown knob 'temperature'"):
        sweep_plan("temperature", "0.5")
    for knob in ("max_num_seqs", "block_size", "kv_cache_gib", "hf_max_batch_size"):
        for device in ("cpu", "cuda"):
            SweepPlan(knob, parse_values(knob, default_values(knob, device)))  # parses
    SweepPlan("block_size", parse_values("block_size", default_values("block_size", "cpu")), LOAD).check(CPU)


POINTS = [{"value": 1, "restart_s": 20.0, "kv_total_blocks": 40, "output_tok_s@2": 10.0, "ttft_p50_s@2": 0.5,
           "tpot_p50_s@2": 0.05, "kv_peak_used_blocks@2": 3},
          {"value": 4, "restart_s": 22.0, "kv_total_blocks": 40, "output_tok_s@2": 18.0, "ttft_p50_s@2": 0.2,
           "tpot_p50_s@2": 0.06, "kv_peak_used_blocks@2": 4}]


def test_progress_names_the_value_running_what_is_left_and_each_restart():
    result = SweepResult(plan=SweepPlan("max_num_seqs", (1, 4, 16), LOAD), model="m", points=POINTS,
                         message="max_num_seqs=16 (3/3; 0 left after it): restarting vllm")
    line = sweep_progress(result)
    assert "max_num_seqs=16 (3/3; 0 left after it)" in line and "1 (restart 20 s), 4 (restart 22 s)" in line
    assert "No sweep yet" in sweep_progress(None)


def test_sweep_figure_draws_each_measured_field_against_the_knob():
    data = SweepResult(plan=SweepPlan("max_num_seqs", (1, 4), LOAD), model="m", points=POINTS).to_dict()
    fig = sweep_figure(data)
    names = [t.name for t in fig.data]
    assert names == ["tok/s, 2 users", "TTFT p50, 2 users", "TPOT p50, 2 users", "peak used blocks, 2 users",
                     "blocks in the pool", "restart"]
    assert list(fig.data[1].y) == [500.0, 200.0] and list(fig.data[0].x) == ["1", "4"]  # ms, categories
    assert len(sweep_figure({"knob": "block_size", "points": []}).data) == 2  # nothing measured: empty lines


def test_sweeps_are_stored_and_listed_partial_ones_too(tmp_path):
    db = tmp_path / "r.sqlite"
    result = SweepResult(plan=SweepPlan("max_num_seqs", (1, 4), LOAD), model="m", device={"name": "cpu"},
                         points=POINTS[:1], status=RunStatus.CANCELLED)
    save(db, result)
    result.points = POINTS
    save(db, result)  # updated in place as each value ends
    (stored,) = list_sweeps(db)
    assert stored["status"] == "cancelled" and len(stored["points"]) == 2 and stored["knob"] == "max_num_seqs"
    assert list_sweeps(db, knob="block_size") == []
    assert load_sweep(db, result.id) == stored
    with pytest.raises(KeyError, match="no stored sweep"):
        load_sweep(db, "nope")


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


def sweep(lab, knob, values):
    """Sweep on the module's session; every point measured, the swept engine back on the session's setting."""
    others = {name: engine for name, engine in lab.engines.items() if name != SweepPlan(knob, values).engine}
    result = lab.loop.run_until_complete(run_sweep(lab, SweepPlan(knob, values, LOAD)))
    assert result.status == RunStatus.OK, result.error
    assert [p["value"] for p in result.points] == list(values)
    assert all(p["output_tok_s@2"] > 0 and p["ttft_p50_s@2"] > 0 and p["restart_s"] > 0 for p in result.points)
    assert all(lab.engines[name] is engine for name, engine in others.items())  # the other engine stayed loaded
    assert lab.configs[SweepPlan(knob, values).engine] == lab.config
    return result


@pytest.mark.slow
def test_kv_budget_sweep_changes_the_pool_and_ends_on_the_sessions_own_setting(lab):
    result = sweep(lab, "kv_cache_gib", (0.25, 0.5))
    blocks = [p["kv_total_blocks"] for p in result.points]
    assert blocks[0] < blocks[1] and lab.info["vllm"].kv_total_blocks == blocks[1]
    assert [p["engine_arg"] for p in result.points] == [f"kv_cache_memory_bytes={int(g * 2**30)}" for g in (0.25, 0.5)]
    assert "restor" not in result.message  # the last value was the session's 0.5 GiB: no extra restart


@pytest.mark.slow
def test_hf_batch_size_sweep_measures_each_value(lab):
    result = sweep(lab, "hf_max_batch_size", (1, 2))
    assert [p["engine_arg"] for p in result.points] == ["max_batch_size=1", "max_batch_size=2"]
    reserved = [p["kv_peak_reserved_bytes@2"] for p in result.points]
    assert 0 < reserved[0] < reserved[1]  # one request's slab vs a batch of two


@pytest.mark.slow
def test_cancelled_sweep_keeps_its_finished_values_and_restores_the_engine(lab):
    import asyncio

    async def cancel_after_first_point():
        result = SweepResult(plan=SweepPlan("hf_max_batch_size", (1, 2, 4), LOAD), model="m")
        task = asyncio.ensure_future(run_sweep(lab, result.plan, result))
        while not result.points:
            await asyncio.sleep(0.05)
        task.cancel()
        await task
        return result

    result = lab.loop.run_until_complete(cancel_after_first_point())
    assert result.status == RunStatus.CANCELLED and [p["value"] for p in result.points][:1] == [1]
    assert len(result.points) < 3 and lab.configs["hf"] == lab.config  # restored after the cancel


@pytest.mark.slow
def test_a_new_engine_joins_the_ladder_as_a_rung_through_its_registry_entry_alone(lab):
    """tests/test_new_engine.py's stand-in, registered for this test only, as a chain rung between hf and hf-cb
    (its entry's order): the ladder starts it, runs it beside the session's hf and vllm, and factors it in."""
    from lab.experiments import run_experiment
    from lab.experiments.why import Params
    from tests.test_new_engine import registered

    with registered():
        params = Params(preset="overhead", repeats=1, rungs="hf,echo,vllm")
        result = lab.loop.run_until_complete(run_experiment(lab, "why", params))
    assert result.status == RunStatus.OK, result.error
    rungs = result.fields["rungs"]
    assert [n for n, r in rungs.items() if r["status"] == "ran"] == ["hf", "echo", "vllm"]
    assert rungs["echo"]["engine"] == "echo" and rungs["echo"]["tok_s"][0] > 0
    assert [(f["lower"], f["upper"]) for f in result.fields["factors"]] == [("hf", "echo"), ("echo", "vllm")]
    assert result.fields["product"] == pytest.approx(result.fields["total"]["value"])


def test_a_restart_runs_to_its_end_through_a_cancel_and_then_reports_it():
    import asyncio

    from lab.session import through_cancel

    async def main():
        done = []

        async def start():  # like an engine start: a thread that cannot be interrupted
            await asyncio.sleep(0.2)
            done.append(True)
            return "info"

        task = asyncio.ensure_future(through_cancel(start()))
        await asyncio.sleep(0.05)
        task.cancel()
        return await task, done

    assert asyncio.run(main()) == (("info", True), [True])
