"""The time estimate learns from stored runs of this device and model, and says when it cannot."""

from lab.config import LoadConfig, RunPlan
from lab.estimate import estimate_run, estimate_text, level_output_tokens, measured_rates

PLAN = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(1, 4), requests_per_user=2, output_len=10))


def summary(model="m", device="cpu-x", rates=((("hf", 1), 5.0), (("vllm", 1), 10.0), (("vllm", 8), 40.0))):
    return {"model": model, "device": {"name": device},
            "runs": [{"engine": e, "users": u, "completed": 1, "output_tok_s": r} for (e, u), r in rates]}


def test_rates_come_from_this_device_and_model_newest_first():
    newer = summary(rates=((("hf", 1), 6.0),))
    rates = measured_rates([newer, summary(), summary(device="gpu"), summary(model="other")], "m", "cpu-x")
    assert rates == {"hf": {1: 6.0}, "vllm": {1: 10.0, 8: 40.0}}


def test_each_level_divides_its_own_tokens_by_the_nearest_measured_speed():
    rates = measured_rates([summary()], "m", "cpu-x")
    assert level_output_tokens(PLAN, 4) == 4 * 2 * 10
    expected = 20 / 5.0 + 80 / 5.0 + 20 / 10.0 + 80 / 40.0  # vLLM at 4 users: 8 is nearer than 1
    assert estimate_run(PLAN, rates).seconds == expected
    assert "about 24 s" in estimate_text(PLAN, [summary()], "m", "cpu-x")


def test_no_stored_run_of_an_engine_means_no_estimate_and_says_why():
    text = estimate_text(PLAN, [summary(rates=((("vllm", 1), 10.0),))], "m", "cpu-x")
    assert text.startswith("No time estimate yet: no finished run of hf with m on cpu-x is stored")
