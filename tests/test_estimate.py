"""The time estimate is computed from the stored runs of this device and model, start to end, and says when it
can only guess."""

import pytest

from lab.config import LoadConfig, RunPlan
from lab.estimate import (
    FIRST_GUESS_NOTE,
    critical_path,
    estimate_run,
    estimate_text,
    history,
    planned_outputs,
    settle_count,
)
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


def test_longer_outputs_take_longer_by_the_fitted_step_time():
    longer = RunPlan(engines=("vllm",), load=LoadConfig(users=(1,), requests_per_user=2, output_len=20))
    short = RunPlan(engines=("vllm",), load=LoadConfig(users=(1,), requests_per_user=2, output_len=10))
    past = history([summary()], "m", "cpu-x")
    step = (1.0 - 2 * 0.1) / 20  # the stored 1-user level: 2 rounds, 20 steps in 1.0 s
    assert estimate_run(longer, past).seconds - estimate_run(short, past).seconds == pytest.approx(20 * step)
    assert planned_outputs(longer.load, 1) == [20, 20]


def test_only_this_device_and_model_and_only_finished_levels_count():
    cancelled = summary(device="cpu-x")
    cancelled["status"] = cancelled["runs"][0]["status"] = "cancelled"
    past = history([summary(device="gpu"), summary(model="other"), cancelled], "m", "cpu-x")
    assert [t.users for t in past.levels["hf"]] == [4] and past.gap_s is None  # a cancelled run has no gap
    assert history([summary(device="gpu")], "m", "cpu-x").runs == 0


def test_a_fresh_install_gets_the_first_guess_and_says_so():
    text = estimate_text(PLAN, [], "m", "cpu-x")
    assert text.startswith("Estimated time: about ") and FIRST_GUESS_NOTE in text
    assert "for hf, vllm: no finished run of them is stored for cpu-x yet" in text
    stored = estimate_text(PLAN, [summary()], "m", "cpu-x", restarts={"vllm": 30.0})
    assert stored == ("Estimated time: about 50 s, restarting vllm first (computed from the 1 stored run of "
                      "cpu-x; warm-up and pauses included).")
