"""The GPU track's answers that read false or odd (docs/results/h200-notebooks/README.md, findings 1-10), each fed the
H200 run's recorded numbers (from its NN_*.txt outputs) and a CPU run's, which disagree: every sentence follows its
own numbers on both devices. Pure: no engine, no notebook."""

import json
from pathlib import Path

from lab.experiments.blocks_words import block_count_answer, blocks_needed_lines
from lab.experiments.cache_words import cache_time_lines
from lab.experiments.phases_words import phases_answer
from lab.experiments.preemption_words import preemption_lines
from lab.experiments.prefix_words import ttft_words
from lab.experiments.waste_words import at_most_held_words, waste_answer
from lab.metrics.kv import waste_stats
from lab.metrics.levels_words import ratio_note
from lab.metrics.steps_words import level_lines
from lab.sweeps.words import blocks_answer
from lab.words.story import level_words, sharing_story

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "docs/results/cpu-experiments"


def cpu_result(name: str) -> dict:
    return json.loads((CPU / name / "experiment.json").read_text())


def cache_fields(with_ms, without_ms, lengths):
    return {"ms_per_token": {"with cache": list(zip(lengths, with_ms, strict=True)),
                             "without cache": list(zip(lengths, without_ms, strict=True))}}


def test_3_the_cache_opener_says_fell_where_a_cost_fell_and_names_a_slower_cached_token():
    """02 answer 1 on the H200: with the cache 50.2 ms at 16 tokens and 31.7 at 512, without it 21.3 and 32.5."""
    gpu = " ".join(cache_time_lines(cache_fields((50.2, 31.7), (21.3, 32.5), (16, 512))))  # its output's two ends
    assert "its cost grew 1.5x over these lengths; with the cache it fell to 0.63x" in gpu and "grew 0.6x" not in gpu
    assert "At 16 tokens (50.2 against 21.3 ms) a token took longer with the cache than without it" in gpu
    assert "the experiment's first decode" in gpu and "saved only 2.5% of a token's time" in gpu
    cpu = " ".join(cache_time_lines(cache_fields((32.0, 33.0), (40.0, 128.0), (16, 256))))  # a CPU's shape: no CPU
    assert "grew 3.2x over these lengths; with the cache it stayed within 5%" in cpu  # cache run is recorded
    assert "longer with the cache" not in cpu and "the cache saved 74% of a token's time" in cpu


def waste_fields(hf, vllm, block, low, high):
    return {"hf": {"waste_pct": {"mean": hf}}, "vllm": {"waste_pct": {"mean": vllm}, "block_size": block},
            "tokens_per_request": {"min": low, "max": high}}


def test_5_the_equal_waste_answer_counts_the_blocks_a_request_held():
    """02 answer 7: on the H200 every request held 135 tokens (9 blocks of 16); on the CPU (issue #42) 7-token prompts
    and 24-token answers held 31 tokens in blocks of 128."""
    gpu = waste_answer(waste_fields(0.0, 9.55, 16, 135, 135))[1]
    assert "135 tokens, 9 blocks of 16 each (computed), whose last holds 7 of its 16 slots" in gpu
    assert "its one block" not in gpu and "one partly empty last block among 9" in gpu
    cpu = waste_answer(waste_fields(0.0, 85.8, 128, 31, 31))[1]
    assert "31 tokens, fewer than one block of 128, so most of each one's only block stayed empty" in cpu


def test_4_the_blocks_answer_compares_block_sizes_only_where_they_differ():
    """02 answer 3: the H200's blocks are 16 already; the CPU's 128."""
    gpu = " ".join(blocks_needed_lines(300, 20, 16))
    assert "blocks hold 16 tokens already" in gpu and "380 blocks is its count too" in gpu and "at 16 it" not in gpu
    cpu = " ".join(blocks_needed_lines(300, 20, 128))
    assert "At this engine's block size, 128: 60 blocks (computed)" in cpu and "in blocks of 128 it needs 3" in cpu


def prefix_fields(first_s, last_s, low, high):
    return {"first": {"ttft_p50_s": first_s}, "last": {"ttft_p50_s": last_s},
            "ttft_ratio_spread": {"low": low, "high": high, "n": 3}}


def test_7_the_ttft_line_takes_its_milliseconds_and_ratio_from_one_statistic():
    """05 answer 1: on the H200 16 ms first, 14 ms last, repeats 0.74-1.02x; on the CPU (tests/test_sentences.py's
    recorded run) 50.9 ms and 280.4 ms, repeats 5.17-5.60x."""
    gpu = ttft_words(prefix_fields(0.016, 0.014, 0.74, 1.02))
    assert "16 ms first vs 14 ms last, 0.88x (measured; each order's median over its repeats" in gpu
    assert "the repeats straddle 1" in gpu
    cpu = ttft_words(prefix_fields(0.0509, 0.2804, 5.17, 5.60))
    assert "51 ms first vs 280 ms last, 5.51x" in cpu and "computed only its own tokens" in cpu


def pools(small, normal):
    return {"small": small, "normal": normal, "preemption_mode": "recompute"}


GPU_POOLS = pools({"kv_blocks": 129, "completed": 192, "errors": 0, "preemptions": 41, "output_tok_s": 1784.7,
                   "peak_waiting": 60},
                  {"kv_blocks": 728, "completed": 192, "errors": 0, "preemptions": 35, "output_tok_s": 7322.3,
                   "peak_waiting": 40})


def test_9_the_preemption_answer_says_both_counts_when_both_pools_preempted():
    """06 answer 3: on the H200 the normal pool preempted too (35 against 41); on the CPU only the small one did."""
    gpu = " ".join(preemption_lines(GPU_POOLS))
    assert "both pools ran out" in gpu and "41 time(s) in the small pool and 35 in the normal one" in gpu
    assert "not the small pool's alone" in gpu
    recorded = cpu_result("preemption")
    cpu = " ".join(preemption_lines(pools(recorded["small"], recorded["normal"])))
    assert "4 time(s) a running request needed a block" in cpu and "the normal pool never preempted" in cpu
    assert "both pools" not in cpu
    measured = " ".join(preemption_lines(pools({**GPU_POOLS["small"], "mean_running": 12.3},
                                               {**GPU_POOLS["normal"], "mean_running": 30.1})))
    assert "12.3 requests ran in its average step against 30.1" in measured
    story = sharing_story({"n=4 in one request": {"peak_blocks": 51}, "unshared_blocks_estimate": 144}, 4, GPU_POOLS)
    assert "the normal pool of 728 blocks preempted too (35 times)" in story
    assert "preempted too" not in sharing_story({"n=4 in one request": {"peak_blocks": 5},
                                                 "unshared_blocks_estimate": 8}, 4,
                                                pools(recorded["small"], recorded["normal"]))


def gains(hf_decode, hf_prefill, vllm_decode, vllm_prefill):
    def one(value, low, high):
        return {"gain": value, "gain_spread": {"low": low, "high": high, "n": 3}} if low else {"gain": value}

    return {"decode": {"hf": one(*hf_decode), "vllm": one(*vllm_decode)},
            "prefill": {"hf": one(*hf_prefill), "vllm": one(*vllm_prefill)}}


def test_6_the_phases_reasons_follow_the_measured_gains():
    """03 answer 1: on the H200 HF gained 56.93x (decode) and 26.53x (prefill) from 1 to 64 users, vLLM 28.38x and
    3.01x; on the CPU (docs/results/cpu-experiments/phases, 1 to 5 users) HF 3.19x and 0.66x, vLLM 5.22x and 1.27x."""
    gpu = " ".join(phases_answer(gains((56.93, 49.0, 73.47), (26.53, 25.58, 29.03), (28.38, 27.51, 35.91),
                                       (3.01, 2.44, 3.49)), 64))
    assert "HF's prefill-bound work gained more than vLLM's (26.53x against 3.01x)" in gpu
    assert "grew at most 2.41x in HF against 21.26x in vLLM" in gpu and "at least 97% of HF's 1-user step" in gpu
    assert "HF gained more than vLLM (56.93x against 28.38x)" in gpu and "filled as fully" not in gpu
    recorded = cpu_result("phases")
    cpu = " ".join(phases_answer({w: recorded[w] for w in ("decode", "prefill")}, 5))
    assert "HF gained less than vLLM" in cpu and "HF's prefill-bound work gained more" not in cpu


def factor(name, value, low, high):
    return {"name": name, "value": value, "low": low, "high": high, "n": 3}


GPU_LEVEL = {"base": "hf", "top": "vllm", "product": 13.02,
             "factors": {"tokens_per_step": factor("tokens_per_step", 0.97, 0.96, 0.98),
                         "s_per_step": factor("s_per_step", 13.41, 13.0, 13.8),
                         "busy_fraction": factor("busy_fraction", 1.0, 0.99, 1.01)},
             "engines": {"hf": {"tokens_per_step": 1.0, "s_per_step": 0.0416, "busy_fraction": 1.0},
                         "vllm": {"tokens_per_step": 1.0, "s_per_step": 0.0031, "busy_fraction": 1.0}}}


def test_8_each_lead_says_which_statistic_it_is():
    """01 and 07 on the H200: 12.90x (the mean tok/s's ratio) and 13.02x (the factors, repeats pooled) at 1 user; on
    the CPU (docs/results/cpu-epyc-2core/factors/spread-1-4) the same two statistics, labelled the same way."""
    gpu = {"ratio": {"1": "12.90", "32": "9.28"}, "factors": {"1": GPU_LEVEL}}
    assert "the ratio was 12.90x (each ratio here: each engine's mean tok/s over its repeats" in ratio_note(gpu)
    assert "the factors below take the repeats pooled" in ratio_note(gpu)
    first = level_lines(1, GPU_LEVEL)[0]
    assert "vLLM/HF 13.02x = " in first
    assert "(measured, the repeats pooled: all their tokens over all their time;" in first
    assert "the lead (13.02x, the repeats pooled" in level_words(1, GPU_LEVEL)
    cpu = json.loads((ROOT / "docs/results/cpu-epyc-2core/factors/spread-1-4/summary.json").read_text())
    users = max(cpu["factors"], key=int)
    note = ratio_note(cpu, int(users))
    assert f"{float(cpu['ratio'][users]):.2f}x (each ratio here" in note and "the repeats pooled" in note
    level = cpu["factors"][users]
    assert f"({level['product']:.2f}x, the repeats pooled" in level_words(int(users), level)


def block_point(size, blocks, tok_s, low, high, **more):
    return {"value": size, "kv_block_size": size, "kv_total_blocks": blocks, "output_tok_s@32": tok_s,
            "output_tok_s_spread@32": {"low": low, "high": high, "n": 3}, **more}


def test_10_the_block_size_gap_gets_the_runs_reason_or_says_it_has_none():
    """04 answer 3 on the H200: 4,793 tok/s in blocks of 16 against 3,300 in blocks of 32 (1.45x, apart); its output
    shows no preemption count or peak, and a run that read them gives the reason they show."""
    gpu = [block_point(16, 728, 4793.0, 4347.2, 5623.6), block_point(32, 364, 3300.4, 3260.7, 3344.1)]
    said = " ".join(blocks_answer(gpu, "32"))
    assert "Blocks of 16 tokens were fastest here. Blocks of 32 made 0.69x their tok/s" in said
    assert "this run read no preemption count or peak to explain it" in said
    read = {"preemptions@32": 0, "kv_peak_used_blocks@32": 300}
    quiet = " ".join(blocks_answer([block_point(16, 728, 4793.0, 4347.2, 5623.6, **read),
                                    block_point(32, 364, 3300.4, 3260.7, 3344.1, **read)], "32"))
    assert "neither preemptions (0 against 0) nor a full pool" in quiet and "this run does not say why" in quiet
    full = {"preemptions@32": 12, "kv_peak_used_blocks@32": 364}
    busy = " ".join(blocks_answer([block_point(16, 728, 4793.0, 4347.2, 5623.6, **read),
                                   block_point(32, 364, 3300.4, 3260.7, 3344.1, **full)], "32"))
    assert "vLLM preempted 12 time(s) there against 0" in busy
    cpu = [block_point(64, 182, 30, 29, 31), block_point(128, 91, 33, 32, 34)]  # tests/test_sentences.py's CPU pair
    assert "Blocks of 128 tokens were fastest here. Blocks of 64 made 0.91x their tok/s" in " ".join(
        blocks_answer(cpu, "32"))
    same = [block_point(64, 182, 30, 28, 33), block_point(128, 91, 31, 29, 34)]
    assert "explain" not in " ".join(blocks_answer(same, "32"))


def test_1_the_block_count_answer_does_not_give_a_one_block_reason_for_a_wider_gap():
    """02 answer 4: on the H200 the counts differed by up to 210 blocks with 16 requests (agree False); on the CPU
    (docs/results/cpu-experiments/blocks) by 1 (agree True)."""
    gpu = {"samples": 96, "max_abs_diff_blocks": 210, "agree": False, "peak_used_blocks": 331, "num_blocks": 728,
           "vllm_ahead": True}
    said = " ".join(block_count_answer(gpu))
    assert "by more than one block per running request" in said and "one step later" not in said
    cpu = {**cpu_result("blocks"), "vllm_ahead": True}
    assert "one step later" in block_count_answer(cpu)[1] and "more than one block" not in block_count_answer(cpu)[1]


def test_2_the_waste_at_the_most_held_says_what_it_is_and_when_it_is_not_known():
    """02 answer 6: on the H200 vLLM's 'peak' was 0.0 % (its counted tokens passed its blocks then) beside a 2.69 %
    mean; on the CPU (the stored spread run) HF 81.2 % and vLLM 75.59 %."""
    over = waste_stats([(0.0, 512, 600), (1.0, 256, 200), (2.0, 0, 0)])
    assert over["peak"] == 0.0 and over["peak_counted_over"] and 0 < over["mean"] < 0.5
    gpu = at_most_held_words({"hf": {"waste_pct": {"peak": 96.88, "mean": 73.93}},
                              "vllm": {"waste_pct": {"peak": 0.0, "mean": 2.69, "peak_counted_over": True,
                                                     "peak_held_tokens": 5296}}})
    assert "HF 96.88 %" in gpu and "vLLM not known (the requests' tokens counted then exceeded the 5,296 slots" in gpu
    assert "not the highest" in gpu and "Peaks" not in gpu
    cpu = at_most_held_words({"hf": {"waste_pct": {"peak": 81.2, "mean": 60.65}},
                              "vllm": {"waste_pct": {"peak": 75.59, "mean": 54.71, "peak_counted_over": False}}})
    assert "HF 81.2 %; vLLM 75.59 %" in cpu and "not known" not in cpu
