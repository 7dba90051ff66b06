"""The lessons' pure parts, on recorded runs that disagree: measured against computed labels, the noise check, the
one story (notebook 01's and 07's sentences on one run), the waste lesson's block sizes, and how notebooks 01, 02,
04 and 07 are wired (their executed runs are tests/test_notebooks*.py's)."""

import json
from pathlib import Path

import pytest

from lab.engines.base import EngineSample
from lab.experiments.waste_words import block_size_answer
from lab.load.driver import RequestRecord
from lab.metrics.levels_words import load_facts
from lab.metrics.steps_words import larger
from lab.notebook import against, noise
from lab.sweeps.words import batch_answer
from lab.words.labels import kv_origin, reported
from lab.words.story import WHAT, ladder_story, lead_story, level_words, paging_story, place, queue_story
from tests.test_sentences import rows, summary

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def test_a_label_says_measured_only_where_an_engine_reported_the_figure():
    blank = "Computed: **23,040 bytes** (you left your prediction blank)."
    assert against(None, 23040, " bytes", origin="formula") == blank
    assert against(None, 380, " blocks", origin="formula").startswith("Computed: **380 blocks**")
    assert against(2, 2.384, "x") == "You predicted **2x**; measured: **2.38x**."
    assert against(50, 56.9, " %", origin="shape").endswith("computed: **56.9 %**.")
    with pytest.raises(ValueError, match="one of engine, formula, shape, arithmetic"):
        against(None, 1.0, origin="guess")
    assert (kv_origin("vllm"), kv_origin("hf"), kv_origin("hf-static")) == ("engine", "shape", "shape")


def test_reported_numbers_leave_out_what_the_lab_computed():
    cache = {"bytes_per_token": 23040, "pool_tokens_computed": 11650, "pool_tokens_vllm": 11648,
             "growth": {"without cache": 3.2}}
    assert set(reported(cache, "cache")) == {11648, 3.2}
    waste = {"hf": {"waste_pct": {"mean": 56.9}}, "vllm": {"waste_pct": {"mean": 50.9}},
             "block_sizes": {"128": {"origin": "engine", "requests_at_once": 77},
                             "16": {"origin": "formula", "requests_at_once": 180}}}
    assert set(reported(waste, "waste")) == {50.9, 77}
    assert not list(reported({"max_len_requests_at_once": 44}, "memory"))
    assert set(reported([{"output_tok_s@4": 31.5, "kv_peak_reserved_bytes@4": 2**20}], "sweep")) == {31.5}


RECORDED_NOISE = """INFO 11-28 10:00:01 [core.py:93] Initializing a V1 LLM engine
(EngineCore pid=4242) WARNING 11-28 10:00:02 [cpu.py:120] force killing
W1128 10:00:03.123 numa.cpp:12] NUMA binding failed
/x/site-packages/torch/_inductor.py:12: FutureWarning: torch.foo is deprecated
Loading safetensors: 100%|##########| 1/1 [00:00<00:00, 4.2it/s]"""


def test_the_noise_check_catches_any_log_line_by_its_shape_and_anything_on_stderr():
    said = "The ratio at 5 users grew from 2.05x with `spread` to 3.20x with `equal`.\n{'1': 1.8, '5': 2.3}"
    assert noise(RECORDED_NOISE + "\n" + said) == RECORDED_NOISE.splitlines()
    triton = "Triton is installed, but doesn't include CPU backend. Disabling Triton."  # vLLM's, printed bare
    assert noise(said, triton + "\n\n") == [triton]


def recorded(name: str) -> dict:
    return json.loads((ROOT / "docs/results/cpu-epyc-2core/factors" / name / "summary.json").read_text())


@pytest.mark.parametrize("name", ["spread-1-4", "spread-4-hf-cap-1"])
def test_07s_sentence_and_01s_name_the_same_dominant_factor_of_one_recorded_run(name):
    """spread-1-4: vLLM's cheaper step made the lead; spread-4-hf-cap-1 (HF one request a batch): tokens per step."""
    run = recorded(name)
    users, level = max(run["factors"].items(), key=lambda kv: int(kv[0]))
    ladder = {"steps": level, "load": {"users": int(users)}, "preset": "spread", "factors": []}
    first, seventh = lead_story(run), ladder_story([ladder])
    said = level_words(int(users), level)
    assert said in first and said in seventh
    cause = WHAT[larger(level)["name"]]
    assert f"{cause} made most of the lead" in first and f"{cause} made most of the lead" in seventh
    expected = {"spread-1-4": "s_per_step", "spread-4-hf-cap-1": "tokens_per_step"}[name]
    assert larger(level)["name"] == expected


NOTEBOOK_07 = ROOT / "docs/results/cpu-why/notebook-07.json"  # its two ladders' fields, recorded on 2 cores


def test_07s_story_reconciles_each_ladder_with_the_factors_of_its_own_load():
    """At 1 user the ladder's largest step (hf-cb → vllm) and the factors (time per step) point the same way; with
    `spread` the ladder's largest step is batching (hf → hf-cb) while the factors find time per step: the rows a step
    and a row's cost say why. 01's helper, fed the same recorded level, names the same factor."""
    recorded = json.loads(NOTEBOOK_07.read_text())
    overhead, spread = recorded["overhead"], recorded["spread"]
    said = ladder_story([overhead, spread])
    assert "1.88x, the same way the factors point" in said
    assert "HF's batch ran 4.0 rows a step for 2.5 useful tokens and vLLM's 3.6 for 3.7" in said
    assert "a row's share of a step took 30.1 ms in HF, 16.5 ms in vLLM" in said
    assert "added 1.48x tokens per step at 4 users, less than the step's cost gave" in said
    first = lead_story({"factors": {"4": spread["steps"]}})
    assert level_words(4, spread["steps"]) in first and level_words(4, spread["steps"]) in said


def test_a_story_sentence_refuses_a_link_it_does_not_have():
    assert "**paging**" in place("paging", "x.")
    with pytest.raises(ValueError, match="choose one of cache, paging"):
        place("speed", "x.")


def block_rows(waste32, fit32, peak=12, total=91):
    return {"128": {"block_size": 128, "origin": "engine", "waste_pct": 50.9, "held_per_request": 150.2,
                    "pool_tokens": 11648, "requests_at_once": 77, "num_blocks": total, "peak_used_blocks": peak},
            "32": {"block_size": 32, "origin": "engine", "waste_pct": waste32, "held_per_request": 70.4,
                   "pool_tokens": 11648, "requests_at_once": fit32, "num_blocks": 4 * total},
            "16": {"block_size": 16, "origin": "formula", "waste_pct": 8.1, "held_per_request": 62.0,
                   "pool_tokens": 11648, "requests_at_once": 187}}


def test_the_waste_lesson_says_what_the_smaller_block_did_to_the_waste_and_to_requests_at_once():
    helped = " ".join(block_size_answer({"block_sizes": block_rows(17.2, 165)}))
    assert "Smaller blocks wasted less" in helped and "holds 165 such requests at once against 77: 88 more" in helped
    assert "16.0 % in blocks of 16" not in helped and "8.1 % in blocks of 16 (computed)" in helped
    assert "17.2 % in blocks of 32 (measured)" in helped and "the pool 187 such requests at once" in helped
    did_not = " ".join(block_size_answer({"block_sizes": block_rows(52.0, 70)}))
    assert "Smaller blocks wasted no less here" in did_not and "no more at once with the smaller blocks" in did_not
    assert block_size_answer({"block_sizes": {"16": block_rows(1, 1)["16"]}}) == []  # one size: nothing to compare


def test_the_paging_story_says_whether_the_load_needed_the_room():
    roomy = paging_story({"block_sizes": block_rows(17.2, 165)}, 4)
    assert "hold 165 requests of this run at once instead of 77" in roomy and "at most 12 of its 91 blocks" in roomy
    full = paging_story({"block_sizes": block_rows(17.2, 165, peak=91)}, 64)
    assert "filled all 91 blocks" in full and "not what limited" not in full
    gpu = block_rows(17.2, 165)["128"] | {"block_size": 16, "held_per_request": 40.0, "requests_at_once": 291}
    one = paging_story({"block_sizes": {"16": gpu}}, 32)  # a GPU's run: its blocks are the paper's already
    assert "blocks of 16 only" in one and "the pool holds 291 such requests at once" in one


def test_the_queue_story_follows_the_sweeps_tok_s_and_its_spread():
    def point(value, tok_s, low, high):
        return {"value": value, "output_tok_s@4": tok_s, "output_tok_s_spread@4": {"low": low, "high": high, "n": 3}}

    capped = queue_story(point(1, 12.0, 11.5, 12.4), point(256, 30.0, 29.0, 31.0), "4")
    assert "0.40x the output tok/s" in capped and "fewer requests in a step made fewer tokens" in capped
    same = queue_story(point(1, 29.5, 28.0, 30.5), point(256, 30.0, 29.0, 31.0), "4")
    assert "within the repeats' spread" in same


def test_waste_at_a_block_size_is_each_requests_measured_tokens_cut_into_whole_blocks():
    from types import SimpleNamespace

    from lab.experiments.waste import computed_row, cut_into_blocks

    def sample(t):
        return EngineSample("vllm", t, 1, 0, kv_usage=0.1, kv_total_blocks=10, kv_block_size=128)

    record = RequestRecord("vllm", 1, 0, "r0", send_s=0.0, prompt_tokens=20, max_tokens=4, first_token_s=0.5,
                           end_s=3.5, token_times_s=[0.5, 1.5, 2.5, 3.5])
    level = SimpleNamespace(samples=[sample(t) for t in (1.0, 2.0, 3.0)], records=[record])
    assert cut_into_blocks(level, 16) == [(1.0, 32, 22, 1), (2.0, 32, 23, 1), (3.0, 0, 0, 0)]
    row = computed_row(level, 16, 1280)
    assert row["origin"] == "formula" and row["held_per_request"] == 32 and row["requests_at_once"] == 40
    assert row["waste_pct"] == pytest.approx(round(100 * (1 - 45 / 64), 2))


def test_the_waste_experiment_refuses_a_block_size_vllm_cannot_take_before_anything_loads():
    from lab.config import EngineConfig
    from lab.experiments import parse_params, validate

    params = parse_params("waste", {"block_sizes": "16"})
    with pytest.raises(ValueError, match="block_size=16: vLLM's CPU build needs a multiple of 32"):
        validate("waste", params, EngineConfig(device="cpu"))
    validate("waste", parse_params("waste", {"block_sizes": "32"}), EngineConfig(device="cpu"))


def test_time_to_first_token_says_it_is_a_mean_of_the_repeats_medians():
    said = " ".join(load_facts(rows([8, 96] * 15, [16] * 30), 5, "hf", "vllm", summary(3.0, 0.1, 40, 25)))
    assert "(the mean of the 2 repeats' medians, measured)" in said and "median time to first token" not in said


def test_hf_s_batch_sweep_says_held_not_reserved():
    point = {"value": 1, "kv_peak_reserved_bytes@4": 2**20, "output_tok_s@4": 10.0}
    said = " ".join(batch_answer([point, point | {"value": 4, "output_tok_s@4": 30.0}], "4"))
    assert "Peak KV held" in said and "computed from its batch's shape" in said and "reserve" not in said


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("name", ["01_hf_vs_vllm.ipynb", "02_paged_attention.ipynb", "03_concurrency.ipynb"])
def test_the_agreement_verdict_is_the_last_line_of_its_cell_so_the_notebook_shows_it(name):
    cell = next(source(c) for c in cells(name) if "verdicts(session)" in source(c))
    assert cell.strip().splitlines()[-1].startswith("verdicts(session)")


@pytest.mark.parametrize("name", ["01_hf_vs_vllm.ipynb", "02_paged_attention.ipynb", "03_concurrency.ipynb",
                                  "04_sweeps.ipynb", "05_prefix_caching.ipynb", "06_sharing_a_gpu.ipynb",
                                  "07_why_vllm_wins.ipynb"])
def test_each_notebook_ends_with_its_finding_placed_in_the_story(name):
    answers = [source(c) for c in cells(name) if "answer" in c["metadata"].get("tags", [])]
    assert answers[-1].startswith("story(") and sum("story(" in a for a in answers) == 1


def test_02_asks_for_bytes_per_token_before_any_answer_gives_them_away():
    code = [source(c) for c in cells("02_paged_attention.ipynb") if c["cell_type"] == "code"]
    asked = next(i for i, text in enumerate(code) if "MY_BYTES_PER_TOKEN = None" in text)
    assert not any("memory_lines(" in text or "cache_answer(" in text for text in code[:asked])


def test_04_never_says_hf_reserves_a_cache_that_grows_step_by_step():
    text = " ".join(source(c) for c in cells("04_sweeps.ipynb"))
    assert "HF reserves" not in text and "RESERVED" not in text and "reserved = " not in text


def test_03_05_and_06_place_their_own_findings_and_each_branch_follows_its_numbers():
    """The closing sentences of 03, 05 and 06 on recorded results that disagree."""
    from lab.words.story import concurrency_story, prefix_story, sharing_story

    def decode(gain, low, high):
        return {"vllm": {"gain": gain, "gain_spread": {"low": low, "high": high, "n": 3}}}

    capacity = {"targets": [{"name": "ttft_p95", "limit_s": 2.0}], "ratios": {"vllm/hf": {"value": 4.0,
                                                                                           "bound": "at_least"}}}
    grew = concurrency_story(decode(2.4, 2.2, 2.6), 3, capacity)
    assert "**more tokens per step**" in grew and "so each step made more tokens" in grew
    assert "under ttft_p95 <= 2 s that came to at least 4x HF's users served (computed" in grew
    flat = concurrency_story(decode(1.02, 0.9, 1.1), 3)
    assert "no measured difference" in flat and "each step made more tokens" not in flat and "HF's users" not in flat

    def prefix(first, last, ratio, low, high):
        order = {"computed": {"full_blocks": 3}, "ttft_p50_s": 0.1}
        return {"first": {**order, "hit_rate": first}, "last": {**order, "hit_rate": last},
                "ttft_last_over_first": ratio, "ttft_ratio_spread": {"low": low, "high": high, "n": 3}}

    shared = prefix_story(prefix(0.67, 0.0, 1.8, 1.5, 2.1))
    assert "**paging**" in shared and "67% of the prompt tokens" in shared and "3 full blocks" in shared
    assert "time to first token was 1.80x shorter than the constant-last order's (measured)" in shared
    assert "no measurably sooner" in prefix_story(prefix(0.67, 0.0, 1.05, 0.9, 1.2))
    assert "no block was shared" in prefix_story(prefix(0.0, 0.0, 1.0, 0.9, 1.1))

    def sharing(many):
        return {"n=4 in one request": {"peak_blocks": many}, "unshared_blocks_estimate": 20}

    def pool(preemptions, waiting, tok_s):
        return {"small": {"kv_blocks": 17, "preemptions": preemptions, "peak_waiting": waiting, "output_tok_s": tok_s},
                "normal": {"output_tok_s": 100.0}}

    short = sharing_story(sharing(8), 4, pool(3, 6, 40.0))
    assert "**more requests at once**" in short and "held 8 blocks" in short and "20 for 4 unshared copies" in short
    assert "let them share" in short and "could not hold every request at once (up to 6 waiting, 3 preemption(s))" \
        in short and "0.40x the normal pool's tok/s" in short
    roomy = sharing_story(sharing(20), 4, pool(0, 0, 98.0))
    assert "nothing was shared" in roomy and "still held every request at once" in roomy
