"""A level's ratio taken apart into its steps (lab.metrics.steps) and said in words (lab.metrics.steps_words), on
recorded runs that disagree: which factor made the ratio, and where each engine's step sits against its floor."""

import json
import math
from pathlib import Path

import pytest

from lab.engines.bandwidth import published
from lab.engines.base import EngineSample, StepClock
from lab.metrics.steps import all_factors, level_factors, level_steps
from lab.metrics.steps_words import factors_caption, factors_table, larger, level_lines
from lab.model import shape_bytes

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "docs/results/cpu-epyc-2core/factors"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / name / "summary.json").read_text())


def test_the_clock_times_a_step_from_the_last_step_or_from_work_arriving_at_an_idle_engine():
    clock = StepClock()
    assert clock.step(5.0) is None  # no work ever arrived
    clock.arrive(10.0)
    assert clock.step(10.5) == 0.5
    assert clock.step(10.7) == pytest.approx(0.2)
    clock.arrive(10.8)  # busy: the next step still runs from the last one's end
    assert clock.step(11.0) == pytest.approx(0.3)
    clock.leave(), clock.leave()
    clock.arrive(20.0)  # idle until now: the wait is outside every step
    assert clock.step(20.1) == pytest.approx(0.1)


def sample(step_s=None, tokens=None, running=0, **kv):
    return EngineSample(engine="x", time_s=0.0, running=running, waiting=0, step_s=step_s, step_tokens=tokens, **kv)


def test_level_steps_counts_only_samples_that_close_a_step():
    samples = [sample(running=4, kv_real_bytes=100), sample(0.1, 3, 4, kv_real_bytes=200),
               sample(0.2, 1, 0, kv_real_bytes=0)]
    assert level_steps(samples, 10) == {"count": 2, "busy_s": pytest.approx(0.3), "tokens": 4, "rows": 4.0,
                                        "kv_bytes": 100.0}
    paged = [sample(0.05, 2, 2, kv_usage=0.5, kv_total_blocks=10, kv_block_size=16)]
    assert level_steps(paged, 10)["kv_bytes"] == 0.5 * 10 * 16 * 10
    assert level_steps([sample(running=3)], 10) is None


def test_the_weights_computed_from_the_config_match_the_model_that_loads():
    """SmolLM2-135M's config.json against transformers' own parameter count (meta device: nothing loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from lab.model import embedded_model_dir

    path = embedded_model_dir()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    counted = sum(p.numel() for p in model.parameters())
    assert shape_bytes(json.loads((Path(path) / "config.json").read_text()), "bfloat16") == 2 * counted


def test_the_three_factors_multiply_to_each_levels_ratio():
    """Exactly the pooled ratio (all tokens over all seconds); with one repeat, that is the level's ratio."""
    for name in ("spread-1-4", "spread-8", "mixed-8"):
        summary = recorded(name)
        for users, level in summary["factors"].items():
            assert math.prod(f["value"] for f in level["factors"].values()) == pytest.approx(level["product"])
            rates = {e: sum(r["output_tokens"] for r in runs) / sum(r["duration_s"] for r in runs)
                     for e in ("hf", "vllm") for runs in [[r for r in summary["runs"]
                                                           if r["engine"] == e and r["users"] == int(users)]]}
            assert level["product"] == pytest.approx(rates["vllm"] / rates["hf"], rel=1e-9)
            if summary["load"]["repeats"] == 1:
                assert level["product"] == pytest.approx(summary["ratio"][users], rel=0.01)


def test_the_factors_are_recomputed_from_the_runs_alone():
    summary = recorded("mixed-8")
    again = all_factors(summary["runs"])
    assert again.keys() == summary["factors"].keys()
    for users, level in again.items():
        assert level["product"] == pytest.approx(summary["factors"][users]["product"])


def test_two_recorded_runs_name_different_factors():
    """On this CPU at 4 users of `spread`: HF serving one request at a time (a batch cap of 1, the naive server)
    loses on tokens per step; with HF's batch as wide as the users, vLLM's lead is its cheaper step."""
    one_at_a_time = factors_caption(recorded("spread-4-hf-cap-1"))
    batched = factors_caption(recorded("spread-1-4"))
    assert "Of the three, output tokens per step gave the most (2.52x)" in one_at_a_time
    assert "vLLM held more requests at once than HF ran" in one_at_a_time
    assert "Of the three, less time per step gave the most (2.27x)" in batched
    assert "output tokens per step gave the most" not in batched


def test_the_floor_says_which_step_is_bandwidth_bound_on_two_recorded_gpu_runs():
    """On an H200 (random weights): the 135M shape's steps sit hundreds of times above their floor, both engines;
    the 8B shape's vLLM step is near its floor (reading 16 GB of weights a step) while HF's stays far above."""
    small = factors_caption(json.loads((ROOT / "docs/results/h200-factors/demo/summary.json").read_text()))
    large = factors_caption(json.loads((ROOT / "docs/results/h200-factors/8b/summary.json").read_text()))
    assert "both far above their floors, bound by compute and overhead" in small
    assert "vLLM near the floor (bandwidth-bound), HF far above it" in large
    assert "HF's step 12.5x its floor and vLLM's step 1.6x its floor" in large


def test_a_static_batchs_idle_rows_are_said_and_its_step_split_into_rows_and_time_per_row():
    """On this CPU at 8 users of `spread`, 3 requests each: HF's batch ran finished rows, vLLM refilled them; the
    lead is still mostly the cost of a step, of which rows a step are one part."""
    said = factors_caption(recorded("spread-8"))
    assert "HF's batch ran 4.3 useful rows of 8.0 a step (finished rows and padding ran too)" in said
    assert "Of the three, less time per step gave the most (2.68x)" in said
    assert "Split further: HF's step ran 8.0 rows against vLLM's 5.5 (1.44x)" in said
    assert "| users | vLLM/HF | = tokens per step |" in said


def test_a_factor_whose_repeats_straddle_1_is_never_the_largest():
    level = json.loads(json.dumps(recorded("mixed-8")["factors"]["8"]))
    big = larger(level)
    big.update(low=0.9, high=max(big["value"], 1.1), n=3)
    assert larger(level)["name"] != big["name"]
    for f in level["factors"].values():
        f.update(low=0.9, high=1.1, n=3)
    assert larger(level) is None
    said = " ".join(level_lines(8, level))
    assert "No factor stands out" in said and "gave the most" not in said
    assert "~1" in factors_table({"8": level})


def test_a_level_without_step_counts_says_nothing():
    summary = recorded("spread-1-4")
    for run in summary["runs"]:
        run["steps"] = None
    assert level_factors(summary["runs"], 1, "hf", "vllm") is None
    assert factors_caption({"factors": all_factors(summary["runs"])}) == ""


def test_the_floor_line_branches_on_each_engines_multiple():
    level = json.loads(json.dumps(recorded("spread-1-4")["factors"]["4"]))
    assert "both far above their floors" in " ".join(level_lines(4, level))
    level["engines"]["vllm"]["floor"]["multiple"] = 1.2
    assert "vLLM near the floor (bandwidth-bound), HF far above it" in " ".join(level_lines(4, level))
    level["engines"]["hf"]["floor"]["multiple"] = 1.1
    assert "both near the floor, bound by memory bandwidth" in " ".join(level_lines(4, level))


def test_a_known_gpu_gets_its_published_peak_beside_the_measurement():
    assert published("NVIDIA H200")["published_bytes_per_s"] == 4.8e12
    assert published("NVIDIA H100 80GB HBM3")["published_bytes_per_s"] == 3.35e12
    assert "published_bytes_per_s" not in published("Some Future GPU")


def test_the_ladder_across_users_says_how_the_lead_and_its_steps_moved():
    """The recorded H200 ladder (`spread` at 1, 8 and 64 users, every chain rung): the lead and each level's largest
    clear step; a ladder of one level says nothing across users."""
    from lab.experiments.why_words import ladder_levels_lines

    fields = json.loads((ROOT / "docs/results/h200-factors/ladder/explain.json").read_text())
    said = " ".join(ladder_levels_lines(fields["levels"]))
    assert "vLLM / HF output tok/s: 11.79x at 1 user, 13.10x at 8 users, 6.11x at 64 users." in said
    assert "at 64 users, vllm-compiled → vllm (per-step overhead (CUDA graphs)), 2.53x" in said
    assert "at 8 users output tokens per step 1.49x, less time per step 8.67x" in said
    assert ladder_levels_lines({"64": fields["levels"]["64"]}) == []
