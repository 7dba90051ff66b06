"""The time estimate is computed from the stored runs of this device and model, start to end, and says when it
can only guess."""

from dataclasses import astuple

import pytest

from lab import estimate as estimate_module
from lab.config import LoadConfig, RunPlan, duration_words
from lab.estimate import (
    FIRST_GAP_S,
    FIRST_GUESS,
    FIRST_GUESS_NOTE,
    FIRST_WARMUP_S,
    HISTORY_RUNS,
    PROBE,
    Cost,
    LevelShape,
    StoredLevel,
    calibrated,
    critical_path,
    estimate_run,
    estimate_text,
    fit_cost,
    fit_prices,
    history,
    level_seconds,
    level_shape,
    planned_specs,
    probe,
    probe_requests,
    probe_shape,
    probes_of,
    settle_count,
    stored_history,
    warmup_level,
    warmup_seconds,
)
from lab.load.workloads import RequestSpec
from lab.runs import SETTLE_S

PLAN = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 4), requests_per_user=2, output_len=10))


def summary(model="m", device="cpu-x", wall_s=20.0, durations=((("hf", 1), 2.0), (("vllm", 1), 1.0),
                                                                (("hf", 4), 5.0), (("vllm", 4), 2.0))):
    """A stored run of PLAN (its levels in run order): each level's duration, 0.1 s to a first token, warm-ups
    and its whole time."""
    load = {"requests_per_user": 2, "output_len": 10, "seed": 0, "repeats": 1, "warmup_requests": 2}
    rows = [{"engine": e, "users": u, "status": "ok", "completed": 2 * u, "duration_s": d,
             "ttft_s": {"mean": 0.1}, "tpot_s": {"mean": 0.05}} for (e, u), d in durations]
    return {"model": model, "device": {"name": device}, "workload": "mixed", "load": load, "status": "ok",
            "runs": rows, "warmup_s": {"hf": 1.0, "vllm": 0.5}, "wall_s": wall_s, "engine_args": {}}


def test_critical_paths_of_a_static_batch_and_of_continuous_batching():
    outputs = [4, 9, 2, 3, 8]
    assert critical_path(outputs, 2, static=True) == (3, 9 + 3 + 8)  # each batch waits for its longest
    assert critical_path(outputs, 2, static=True, batch=1) == (5, sum(outputs))
    assert critical_path(outputs, 2, static=False) == (2, 9 + 8)  # the free user takes the next request
    assert critical_path(outputs, 8, static=False) == (1, 9)


def test_rerunning_a_stored_plan_is_estimated_at_its_measured_time():
    estimate = estimate_run(PLAN, history([summary()], "m", "cpu-x"))
    assert estimate.seconds == pytest.approx(20.0) and estimate.guessed == () and estimate.runs == 1
    assert settle_count(["hf", "vllm", "hf", "vllm"]) == 1  # vLLM settles before HF's second level only
    gap = (20.0 - 1.5 - 10.0 - SETTLE_S) / 4
    twice = RunPlan(engines=PLAN.engines, load=LoadConfig(users=(1, 4), requests_per_user=2, output_len=10,
                                                          repeats=2))
    assert estimate_run(twice, history([summary()], "m", "cpu-x")).seconds == pytest.approx(
        1.5 + 2 * 10.0 + 8 * gap + 3 * SETTLE_S)


def test_only_this_device_and_model_and_only_finished_levels_count():
    cancelled = summary(device="cpu-x")
    cancelled["status"] = cancelled["runs"][0]["status"] = "cancelled"
    past = history([summary(device="gpu"), summary(model="other"), cancelled], "m", "cpu-x")
    assert sorted(past.costs) == ["hf", "vllm"] and past.gap_s is None  # a cancelled run has no gap
    alone = history([summary(durations=((("hf", 4), 5.0),))], "m", "cpu-x").cost("hf")
    assert past.cost("hf") == alone  # the cancelled 1-user level is left out
    assert history([summary(device="gpu")], "m", "cpu-x").runs == 0


def test_stored_runs_of_this_model_are_found_behind_newer_runs_of_other_models(monkeypatch):
    newest_first = [summary(model="other")] * (HISTORY_RUNS + 10) + [summary()]
    monkeypatch.setattr(estimate_module, "list_summaries", lambda db_path, limit: newest_first[:limit])
    assert stored_history("lab.db", "m", "cpu-x").runs == 1  # the page's line and a started run's estimate alike


def test_a_static_batch_counts_its_padding_and_finished_rows_continuous_batching_each_requests_own():
    specs = [RequestSpec(10, 4), RequestSpec(2, 8)]
    assert level_shape(specs, 2, static=True) == LevelShape(
        prefill=2 * 10, wave=20, steps=8, kv=2 * (8 * 10 + 36), rows=2 * 8)  # both rows padded to 10, run 8 steps
    assert level_shape(specs, 2, static=False) == LevelShape(
        prefill=12, wave=12, steps=8, kv=(4 * 10 + 10) + (8 * 2 + 36), rows=4 + 8)
    assert level_shape(specs, 2, static=True, batch=1).steps == 4 + 8  # one row at a time: one after the other
    assert [spec.output_len for spec in planned_specs(PLAN.load, 4)] == [10] * 8  # 4 users x 2 requests each


# HF's cost on a 2-core CPU (fitted to bench.estimates' levels): a step is mostly its padded KV tokens
HF_CPU = Cost(prefill_s=0.001, step_s=0.027, kv_s=2.6e-5)


def measured(cost, users, workload="mixed", output_len=24, requests_per_user=1, warmup_extra=0.3, slowed=1.0):
    """A stored HF run whose levels take exactly what ``cost`` says (times ``slowed``), its warm-up
    ``warmup_extra`` beyond its requests."""
    load = LoadConfig(users=users, workload=workload, output_len=output_len, requests_per_user=requests_per_user)
    stored = {"model": "m", "device": {"name": "cpu-x"}, "workload": workload, "status": "ok", "engine_args": {},
              "load": {"requests_per_user": requests_per_user, "output_len": output_len, "seed": 0,
                       "warmup_requests": 2}, "runs": []}
    for u in users:
        shape = level_shape(planned_specs(load, u), u, static=True)
        stored["runs"].append({"engine": "hf", "users": u, "status": "ok", "completed": u * requests_per_user,
                               "duration_s": slowed * cost.seconds(shape),
                               "ttft_s": {"mean": slowed * cost.prefill_s * shape.wave}, "tpot_s": {}})
    stored["warmup_s"] = {"hf": cost.seconds(warmup_level(load, "hf", None)) + warmup_extra}
    return stored


def hf_plan(users, workload, output_len, requests_per_user=1):
    return RunPlan(engines=("hf",), load=LoadConfig(users=users, workload=workload, output_len=output_len,
                                                   requests_per_user=requests_per_user))


def test_a_steps_price_follows_its_kv_tokens_not_its_user_level():
    past = history([measured(HF_CPU, (1, 4, 8)), measured(HF_CPU, (2, 5), output_len=8)], "m", "cpu-x")
    assert astuple(past.cost("hf")) == pytest.approx(astuple(HF_CPU), rel=1e-3)
    for users, workload, out, per_user in ((2, "decode", 24, 1), (6, "decode", 24, 1), (3, "equal", 48, 2)):
        plan = hf_plan((users,), workload, out, per_user)  # short prompts: far fewer KV tokens per row than mixed
        truth = HF_CPU.seconds(level_shape(planned_specs(plan.load, users), users, static=True))
        assert level_seconds(plan, "hf", users, past.cost("hf")) == pytest.approx(truth, rel=1e-3)
    assert warmup_seconds(hf_plan((2,), "decode", 24), "hf", past) == pytest.approx(
        HF_CPU.seconds(warmup_level(hf_plan((2,), "decode", 24).load, "hf", None)) + 0.3)  # its own short prompts


def test_one_slowed_run_moves_the_fit_little():
    runs = [measured(HF_CPU, (1, 4, 8)), measured(HF_CPU, (2, 5), output_len=8), measured(HF_CPU, (3, 6)),
            measured(HF_CPU, (1, 4, 8), slowed=3.0)]  # a neighbour's load tripled one run's times
    plan = hf_plan((2, 6), "decode", 24)
    fitted = history(runs, "m", "cpu-x").cost("hf")
    assert level_seconds(plan, "hf", 6, fitted) == pytest.approx(level_seconds(plan, "hf", 6, HF_CPU), rel=0.05)


def test_no_price_is_fitted_below_zero():
    levels = [StoredLevel(LevelShape(0, 0.0, steps, kv, rows), None, seconds, 0.0)
              for steps, kv, rows, seconds in ((10, 100, 10, 1.0), (10, 1000, 40, 1.2), (10, 2000, 80, 1.1))]
    fitted = fit_cost(levels)
    assert min(fitted.step_s, fitted.kv_s, fitted.row_s) >= 0 and fitted.step_s > 0
    assert fit_prices([(1, 2, 3), (2, 4, 6)], [1.0, 2.0], (0, 1)) is None  # steps and KV tokens in step: no fit


def test_a_fresh_install_gets_the_first_guess_and_says_so():
    text = estimate_text(PLAN, history([], "m", "cpu-x"), "cpu-x")
    assert text.startswith("Estimated time: about ") and FIRST_GUESS_NOTE in text
    assert "for HF and vLLM: no finished run of them is stored for cpu-x yet" in text and "probe" not in text
    stored = estimate_text(PLAN, history([summary()], "m", "cpu-x"), "cpu-x", restarts={"vllm": 30.0})
    assert stored == ("Estimated time: about 50 s, restarting vLLM first (computed from the 1 stored run of "
                      "cpu-x; warm-up and pauses included).")


def probed(engine, prefill=1.0, decode=1.0):
    """What the start probe measures on a machine whose prefill and decode take ``prefill`` and ``decode`` times
    the first guess's."""
    cost, shape = FIRST_GUESS[engine], probe_shape(engine)
    return {"ttft_s": prefill * cost.prefill_s * shape.wave, "tpot_s": 0.0,
            "duration_s": prefill * cost.prefill_s * shape.prefill + decode * cost.decode(shape)}


def test_the_first_guess_is_priced_on_this_machine_by_its_start_probe():
    """The issue's case: the Workshop demo guessed ~1 min 7 s from another CPU's figures and took 144 s."""
    from lab.config import EngineConfig
    from lab.presets import workshop_demo

    demo = workshop_demo(EngineConfig(device="cpu")).plan(EngineConfig(device="cpu"))
    guessed = estimate_run(demo, history([], "m", "cpu-x")).seconds
    twice = calibrated(history([], "m", "cpu-x"), {"hf": probed("hf", 2, 2), "vllm": probed("vllm", 2, 2)})
    for engine in ("hf", "vllm"):
        assert astuple(twice.cost(engine)) == pytest.approx(tuple(2 * x for x in astuple(FIRST_GUESS[engine])))
    order = ["hf", "vllm"] * 8  # 2 levels x 4 repeats; settles, pauses and warm-ups' extras are not scaled
    fixed = settle_count(order) * SETTLE_S + len(order) * FIRST_GAP_S + sum(FIRST_WARMUP_S.values())
    assert estimate_run(demo, twice).seconds - fixed == pytest.approx(2 * (guessed - fixed))
    apart = calibrated(history([], "m", "cpu-x"), {"hf": probed("hf", prefill=1, decode=3)}).cost("hf")
    assert apart.prefill_s == pytest.approx(FIRST_GUESS["hf"].prefill_s)
    assert apart.step_s == pytest.approx(3 * FIRST_GUESS["hf"].step_s)


def test_a_stored_run_outranks_the_probe_and_the_text_says_which_priced_what():
    probes = {"hf": probed("hf", 2, 2), "vllm": probed("vllm", 2, 2)}
    stored = calibrated(history([summary()], "m", "cpu-x"), probes)
    assert stored.probed == {} and stored.cost("hf") == history([summary()], "m", "cpu-x").cost("hf")
    text = estimate_text(PLAN, calibrated(history([], "m", "cpu-x"), probes), "cpu-x")
    seconds = probes["hf"]["duration_s"] + probes["vllm"]["duration_s"]
    assert (f"{FIRST_GUESS_NOTE}, scaled by a {seconds:.1f} s probe of HF and vLLM measured at start here, for HF and "
            "vLLM: no finished run of them is stored for cpu-x yet") in text
    assert probes_of({"hf": {"probe": probes["hf"]}, "vllm": {"probe": None}}) == {"hf": probes["hf"]}
    shared = {"others_cores": 1.5, "steal_cores": 0.0, "lab_cores": 0.5, "cores": 2, "seconds": 4.0}
    busy = calibrated(history([], "m", "cpu-x"), {"hf": probes["hf"] | {"machine": shared}, "vllm": probes["vllm"]})
    assert ("measured at start here while other processes used up to 1.50 of the 2 cores (measured: the estimate "
            "holds while they keep that up), for HF and vLLM") in estimate_text(PLAN, busy, "cpu-x")
    assert "other processes" not in text  # a quiet probe's estimate says nothing of them


def test_the_probe_times_its_few_requests_on_an_engine(char_tokenizer):
    import asyncio

    from lab.engines.fake import FakeEngine

    requests = probe_requests(char_tokenizer)
    users, prompt, output = PROBE
    assert len(requests) == users and {len(r.prompt_token_ids) for r in requests} == {prompt}
    assert len({r.prompt_token_ids for r in requests}) == users and all(r.max_tokens == output for r in requests)

    async def timed():
        engine = FakeEngine("vllm")
        await engine.start()
        return await probe(engine, char_tokenizer)

    found = asyncio.run(timed())
    assert set(found) == {"ttft_s", "duration_s", "tpot_s", "machine"} and found["duration_s"] >= found["ttft_s"] > 0


def ladder(started, ended, preset="spread", status="ok", device="cpu-x"):
    """A stored Why ladder (experiment.json's keys the estimate reads)."""
    from dataclasses import asdict

    from lab.experiments.why import Params
    return {"experiment": "why", "started_at": started, "ended_at": ended, "status": status, "model": "m",
            "device": {"name": device}, "params": asdict(Params(preset=preset, repeats=3))}


def test_an_experiment_is_estimated_from_the_stored_ones_of_its_settings(monkeypatch):
    from lab.estimate import experiment_estimate
    from lab.experiments.why import Params

    stored = [ladder("2026-11-29T10:00:00", "2026-11-29T10:04:00"),
              ladder("2026-11-29T09:00:00", "2026-11-29T09:03:00"),
              ladder("2026-11-29T08:00:00", "2026-11-29T08:09:00", preset="memory"),
              ladder("2026-11-29T07:00:00", "2026-11-29T07:01:00", status="cancelled"),
              ladder("2026-11-29T06:00:00", "2026-11-29T06:20:00", device="gpu")]
    monkeypatch.setattr(estimate_module, "list_results", lambda db, kind, name: stored)
    text = experiment_estimate("lab.db", "why", Params(preset="spread", repeats=3), "m", "cpu-x")
    assert text == ("Estimated time: about 3 min 30 s (the median of the 2 stored ladders with these settings on "
                    "cpu-x, measured: 3 min to 4 min).")
    fresh = experiment_estimate("lab.db", "why", Params(preset="overhead", repeats=3), "m", "cpu-x")
    assert fresh.startswith("No estimate yet: none of the ladders with these settings has finished on cpu-x")
    assert fresh.endswith("The last one here, with other settings, took 4 min (measured).")


def test_a_sweep_without_a_stored_one_is_computed_from_its_restarts_and_its_load(monkeypatch):
    from lab.config import EngineConfig
    from lab.estimate import sweep_estimate
    from lab.sweeps import sweep_plan

    monkeypatch.setattr(estimate_module, "list_results", lambda db, kind, name: [])
    config, past = EngineConfig(device="cpu"), history([summary()], "m", "cpu-x")
    plan = sweep_plan("hf_max_batch_size", "1,2", users="2", requests_per_user=1, output_len=10)
    runs = [estimate_run(RunPlan(engines=("hf",), load=plan.load, engine=c), past).seconds
            for c in plan.configs(config)]
    assert runs[0] > runs[1]  # one row at a time takes longer: the batch cap is priced
    text = sweep_estimate("lab.db", plan, config, past, 30.0, "m", "cpu-x")
    total = 3 * 30.0 + sum(runs)  # a restart per value, and one to restore the session's own batch
    assert text.startswith(f"Estimated time: about {duration_words(total)} (computed: 3 restarts of HF at 30 s each, "
                           "its last start here (measured), and each value's load")
    unstarted = sweep_estimate("lab.db", plan, config, past, None, "m", "cpu-x")
    assert unstarted.startswith(f"Estimated time: about {duration_words(sum(runs))} (computed: each value's load")
    assert unstarted.endswith("its 3 restarts of HF are not counted: no start of it is measured yet).")
