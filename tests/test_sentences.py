"""The notebooks' load-test sentences on recorded runs that disagree: each claim follows that run's numbers."""

import json
from pathlib import Path

from lab.experiments.blocks_words import block_count_answer
from lab.metrics.levels_words import levels_answer, load_facts, moved, padding_words, runs_answer

ROOT = Path(__file__).resolve().parents[1]


def run(engine, users, repeat, tok_s, tpot_ms, ttft_ms):
    return {"engine": engine, "users": users, "repeat": repeat, "output_tok_s": tok_s,
            "tpot_s": {"p50": tpot_ms / 1000}, "ttft_s": {"p50": ttft_ms / 1000}}


def summary(ratio5, spread, hf_tpot5, vllm_tpot5):
    """Two repeats at 1 and 5 users; vLLM's time per token at 5 users as given."""
    runs = [run("hf", 1, k, 30, 30, 100) for k in (0, 1)] + [run("vllm", 1, k, 60, 16, 50) for k in (0, 1)]
    runs += [run("hf", 5, k, 50, hf_tpot5, 900) for k in (0, 1)]
    runs += [run("vllm", 5, k, 50 * ratio5, vllm_tpot5 + k, 60) for k in (0, 1)]
    return {"ratio": {"1": "2.0", "5": str(ratio5)}, "runs": runs,
            "spread": {"ratio": {"5": {"n": 2, "mean": ratio5, "low": ratio5 - spread, "high": ratio5 + spread}}}}


def rows(outputs, prompts, engine="vllm", users=5):
    return [{"engine": engine, "users": users, "status": "ok", "output_tokens": o, "prompt_tokens": p}
            for o, p in zip(outputs, prompts, strict=True)]


def test_moved_says_rose_fell_or_within_the_spread():
    assert moved([30, 31], [40, 41], "ms") == "rose from 30.5 to 40.5 ms"
    assert moved([0.04, 0.041], [0.03, 0.031], "ms", 1000) == "fell from 40.5 to 30.5 ms"
    assert moved([30, 35], [33, 36], "ms").startswith("stayed within its repeats' spread")


def test_the_levels_answer_follows_each_runs_time_per_token():
    rose = " ".join(levels_answer(summary(3.0, 0.1, 40, 25), rows([8, 96] * 15, [16] * 30), 1, 5))
    fell = " ".join(levels_answer(summary(3.0, 0.1, 40, 10), rows([8, 96] * 15, [16] * 30), 1, 5))
    assert "vllm: output tok/s rose from 60.0 to 150.0 tok/s; time per output token rose from 16.0 to 25.5" in rose
    assert "time per output token fell from 16.0 to 10.5 ms" in fell
    assert "kept its finished rows" in rose and "Each user sent 3 requests" in rose  # 30 requests, 5 users, 2 repeats


def test_load_facts_say_what_the_load_could_not_hold():
    equal = " ".join(load_facts(rows([16] * 10, [9] * 10), 5, "hf", "vllm", summary(2.0, 0.1, 40, 20)))
    assert "Every answer had the same length" in equal and "Each user sent one request" in equal
    assert "kept its finished rows" not in equal


def test_runs_answer_says_grew_or_shrank_and_whether_the_spread_allows_it():
    first, wider, same = summary(2.05, 0.1, 40, 20), summary(3.20, 0.1, 40, 20), summary(2.10, 0.2, 40, 20)
    assert runs_answer(first, wider, 5, ("mixed", "prefill")) == [
        "The ratio at 5 users grew from 2.05x with `mixed` to 3.20x with `prefill`."]
    assert runs_answer(wider, first, 5, ("prefill", "mixed"))[0].startswith("The ratio at 5 users shrank")
    assert "within the repeats' spread" in runs_answer(first, same, 5, ("mixed", "equal"))[0]


def test_padding_is_computed_from_the_requests_lengths():
    assert "would make 33% of a batch's prompt tokens padding" in padding_words(
        rows([8, 8], [10, 30], engine="hf"), 5, "mixed")
    assert "would make 0% of" in padding_words(rows([8, 8], [9, 9], engine="hf"), 5, "equal")


def cache_fields(with_ms, without_ms, kv_heads=3, ours=11650, theirs=11648):
    return {"ms_per_token": {"with cache": [(16, with_ms[0]), (256, with_ms[1])],
                             "without cache": [(16, without_ms[0]), (256, without_ms[1])]},
            "formula": "2 (K and V) x 30 layers x 3 KV heads x 64 head dim x 2 bytes (bfloat16) = 23,040 bytes",
            "query_heads": 9, "kv_heads": kv_heads, "bytes_per_token": 23040, "pool_bytes": 268435456,
            "pool_tokens_computed": ours, "pool_tokens_vllm": theirs, "block_size": 128}


def test_the_cache_answer_follows_the_measured_growth_and_checks_the_pool():
    from lab.experiments.cache_words import cache_answer

    grew = " ".join(cache_answer(cache_fields((32, 33), (40, 128))))
    flat = " ".join(cache_answer(cache_fields((32, 33), (40, 41), kv_heads=9, theirs=9000)))
    assert "its cost grew 3.2x over these lengths; with the cache it stayed within 5% (1.03x)" in grew
    assert "9 query heads share 3 key/value heads" in grew and "which agrees with vLLM's own count" in grew
    assert "recomputing the past did not show" in flat and "Grouped-query" not in flat and "differs from" in flat


def test_the_waste_answer_names_the_engine_that_wasted_more():
    from lab.experiments.waste_words import waste_answer

    def waste(hf, vllm):
        return {"hf": {"waste_pct": {"mean": hf}}, "vllm": {"waste_pct": {"mean": vllm}, "block_size": 128}}

    assert waste_answer(waste(58.0, 12.0))[0].startswith("HF wasted more here: HF 58.0 %")
    vllm_more = " ".join(waste_answer(waste(0.0, 85.2)))
    assert vllm_more.startswith("vLLM wasted more here") and "blocks of 128 tokens" in vllm_more


def test_the_phases_answer_says_gained_or_lost_and_which_work_gained_more():
    from lab.experiments.phases_words import phases_answer

    def fields(hf_decode, vllm_decode, vllm_prefill):
        return {"decode": {"hf": {"gain": hf_decode}, "vllm": {"gain": vllm_decode}},
                "prefill": {"hf": {"gain": 1.1}, "vllm": {"gain": vllm_prefill}}}

    usual = " ".join(phases_answer(fields(1.8, 2.9, 1.2), 3))
    odd = " ".join(phases_answer(fields(0.47, 0.9, 1.2), 3))
    assert "HF gained 1.80x on decode-bound work" in usual and "Decode gained more" in usual
    assert "HF gained less than vLLM" in usual
    assert "HF lost: its tok/s fell to 0.47x on decode-bound work" in odd and "prefill gained as much" in odd


def test_the_block_table_summary_and_answer_follow_the_ids_vllm_gave():
    from lab.experiments.table import summarize
    from lab.experiments.table_words import table_answer

    steps = [{"step": 0, "tables": {"a": [1, 2], "b": [1, 3], "c": [4, 5]}, "shared": {"1": 2}},
             {"step": 1, "tables": {"b": [1, 3, 6], "d": [2, 7]}, "shared": {}}]
    fields = summarize({"steps": steps, "num_blocks": 16, "block_size": 32})
    assert fields["most_at_once"] == 3 and fields["non_contiguous"] == {"b": [1, 3, 6], "d": [2, 7]}
    assert fields["reused"] == {2: ["a", "d"]} and fields["shared"] == {1: 2}
    text = " ".join(table_answer(fields))
    assert "b held [1, 3, 6]" in text and "block 2 held by a, then d" in text and "up to 2" in text
    tidy = " ".join(table_answer(summarize({"steps": steps[:1], "num_blocks": 16, "block_size": 32})))
    assert "happened to be neighbours" not in tidy  # b's [1, 3] is scattered
    alone = {"steps": [{"step": 0, "tables": {"a": [1, 2]}, "shared": {}}], "num_blocks": 8, "block_size": 32}
    assert "happened to be neighbours" in " ".join(table_answer(summarize(alone)))


def test_the_queue_and_fanout_answers_follow_their_runs():
    from lab.experiments.sharing_words import fanout_answer
    from lab.sweeps.words import queue_answer

    def point(value, ttft, tpot):
        return {"value": value, "ttft_p50_s@4": ttft, "tpot_p50_s@4": tpot}

    assert "the queue cost first tokens more" in queue_answer(point(1, 3.7, 0.03), point(256, 0.09, 0.03), "4")
    assert "did not show in TTFT" in queue_answer(point(1, 0.2, 0.03), point(256, 0.19, 0.03), "4")
    assert fanout_answer({"prefix_hit_tokens": 384}).startswith("Four separate requests of the same prompt shared")
    assert "found nothing in the prefix cache" in fanout_answer({"prefix_hit_tokens": 0})


def turn_row(engine, turn, prompt, hit, ttft):
    return {"engine": engine, "users": 2, "repeat": 0, "turn": turn, "requests": 2, "prompt_tokens_mean": prompt,
            "cached_tokens": None, "prefix_hit_rate": hit, "ttft_p50_s": ttft, "ttft_mean_s": ttft}


def test_chat_answer_follows_the_hits_each_engine_measured():
    from lab.metrics.turns_words import chat_answer

    runs = [{"engine": "vllm", "kv": {"block_size": 128}}, {"engine": "hf", "kv": {}}]
    grew = {"runs": runs, "turns": [turn_row("hf", 1, 261, None, 0.1), turn_row("hf", 3, 800, None, 0.4),
                                    turn_row("vllm", 1, 261, 0.0, 0.05), turn_row("vllm", 3, 800, 0.96, 0.04)]}
    hf, vllm = chat_answer(grew)
    assert "from 100 to 400 ms (4.00x" in hf and "computed every one of the 800 prompt tokens again" in hf
    assert "served 96% of turn 3's prompt tokens (against 0% at turn 1)" in vllm
    flat = {"runs": runs, "turns": [turn_row("vllm", 1, 69, 0.0, 0.07), turn_row("vllm", 2, 90, 0.0, 0.08)]}
    (line,) = chat_answer(flat)
    assert "no more than at turn 1" in line and "whole blocks of 128 tokens" in line and "averaged 69 tokens" in line
    assert chat_answer({"runs": runs, "turns": [turn_row("vllm", 1, 69, 0.0, 0.07)]}) == []  # one turn: nothing said
    long = {"runs": runs, "turns": [turn_row("vllm", 1, 300, 0.0, 0.07), turn_row("vllm", 2, 900, 0.0, 0.08)]}
    (line,) = chat_answer(long)
    assert "no longer cached" in line and "less than a block" not in line  # 300 tokens held whole blocks
    (line,) = chat_answer({**long, "engine_args": {"vllm": {"enable_prefix_caching": False}}})
    assert "prefix cache was off" in line and "computed every one of the 900 prompt tokens again" in line


# Two recorded waste runs on this CPU (4 users x 3 requests): `spread`, where vLLM kept the most of its KV holding
# tokens, and `equal` at 24 tokens, where HF's dynamic batches wasted nothing and vLLM's 128-token blocks the most.
SPREAD = {"hf": {"kinds_pct": {"real": 42.14, "reservation": 0.0, "internal": 57.86, "external": 0.0}},
          "hf-static": {"kinds_pct": {"real": 22.8, "reservation": 10.54, "internal": 66.66, "external": 0.0},
                        "cache_tokens_per_row": 160},
          "vllm": {"kinds_pct": {"real": 44.82, "reservation": 0.0, "internal": 55.18, "external": 0.0},
                   "block_size": 128},
          "tokens_per_request": {"min": 37, "max": 104}}
EQUAL = {"hf": {"kinds_pct": {"real": 100.0, "reservation": 0.0, "internal": 0.0, "external": 0.0}},
         "hf-static": {"kinds_pct": {"real": 32.7, "reservation": 22.66, "internal": 44.64, "external": 0.0},
                       "cache_tokens_per_row": 56},
         "vllm": {"kinds_pct": {"real": 14.79, "reservation": 0.0, "internal": 85.21, "external": 0.0},
                  "block_size": 128},
         "tokens_per_request": {"min": 31, "max": 31}}


def test_the_kinds_answer_follows_each_runs_shares_and_sets_them_beside_the_paper():
    from lab.experiments.waste_words import kinds_answer

    spread, equal = " ".join(kinds_answer(SPREAD)), " ".join(kinds_answer(EQUAL))
    assert "HF with a static cache: 22.8 % of the KV it held held tokens; reservation 10.54 %" in spread
    assert "vLLM kept the largest share" in spread and "HF kept the largest share" in equal
    assert "HF wasted nothing measurable here" in equal and "HF wasted nothing" not in spread
    assert "every request here held 31 tokens, fewer than one block" in equal
    assert "20.4-38.2 %" in spread and "kept 22.8 % here (computed from its batch's shape), within the paper's Orca" \
        in spread
    assert "vLLM kept 14.79 % here (measured), below the paper's 96.3 %" in equal


def test_the_kinds_answer_names_reservation_and_spare_rows_when_they_lead():
    from lab.experiments.waste_words import kinds_answer

    reserved = {"hf-static": {"kinds_pct": {"real": 30.0, "reservation": 50.0, "internal": 15.0, "external": 5.0},
                              "cache_tokens_per_row": 560},
                "vllm": {"kinds_pct": {"real": 97.0, "reservation": 0.0, "internal": 3.0, "external": 0.0},
                         "block_size": 16}, "tokens_per_request": {"min": 300, "max": 560}}
    text = " ".join(kinds_answer(reserved))
    assert "largest waste was reservation (50.0 %): every row was reserved for the load's longest request (560" in text
    assert "vLLM kept 97.0 % here (measured), close to the paper's 96.3 %." in text and "below the paper" not in text
    spare = {"hf-static": {"kinds_pct": {"real": 30.0, "reservation": 10.0, "internal": 20.0, "external": 40.0},
                           "cache_tokens_per_row": 160}}
    assert "rows left over held no request" in " ".join(kinds_answer(spare))


def test_the_waste_change_names_the_engine_whose_waste_moved_more():
    from lab.experiments.waste_words import waste_change

    def waste(hf, vllm):
        return {"hf": {"waste_pct": {"mean": hf}}, "vllm": {"waste_pct": {"mean": vllm}}}

    hf_moved = waste_change(waste(57.86, 55.18), waste(0.0, 85.21), ("spread", "equal"))
    assert hf_moved == ("From `spread` to `equal` HF's fell 57.9 points; vLLM's rose 30.0 points (time-weighted "
                        "waste; HF's computed from its batch's shape, vLLM's measured): HF's waste changed more.")
    assert "vLLM's waste changed more" in waste_change(waste(40, 10), waste(41, 60), ("a", "b"))
    assert "HF's did not move" in waste_change(waste(40, 10), waste(40, 60), ("a", "b"))


def test_gains_carry_their_spread_and_overlapping_gains_are_not_ranked():
    from lab.experiments.phases_words import more_users_answer, phases_answer
    from lab.words import gain_words

    assert gain_words(2.31, {"low": 2.1, "high": 2.52, "n": 3}) == "gained 2.31x (repeats 2.10-2.52x)"
    assert "no measured gain or loss" in gain_words(1.02, {"low": 0.95, "high": 1.1, "n": 3})

    def engine(gain, low, high):
        return {"gain": gain, "gain_spread": {"low": low, "high": high, "n": 3}}

    apart = {"decode": {"hf": engine(1.5, 1.4, 1.6), "vllm": engine(2.6, 2.5, 2.8)},
             "prefill": {"hf": engine(1.1, 1.0, 1.2), "vllm": engine(1.2, 1.1, 1.3)}}
    close = {"decode": {"hf": engine(2.4, 2.0, 2.7), "vllm": engine(2.5, 2.2, 2.9)},
             "prefill": {"hf": engine(1.1, 1.0, 1.2), "vllm": engine(2.3, 2.0, 2.6)}}
    assert "Decode gained more" in " ".join(phases_answer(apart, 3)) and "HF gained less" in " ".join(
        phases_answer(apart, 3))
    said = " ".join(phases_answer(close, 3))
    assert "no measured difference between the two kinds" in said and "gains overlap" in said
    flat = " ".join(more_users_answer(apart["decode"], {"hf": engine(1.6, 1.5, 1.7), "vllm": engine(2.7, 2.6, 2.9)},
                                      (3, 4)))
    grew = " ".join(more_users_answer(apart["decode"], {"hf": engine(1.6, 1.5, 1.7), "vllm": engine(6.0, 5.5, 6.5)},
                                      (3, 8)))
    assert "it flattened" in flat and "it kept growing" in grew


def test_the_exercise_judges_more_users_on_each_repeats_step_and_says_nothing_when_they_straddle():
    """03's exercise on recorded rows: each repeat's step from 3 to 6 users (the same repeat of the first run), and
    a verdict only where every repeat sits on one side of the line (half the users' growth: 1.5x)."""
    from types import SimpleNamespace

    from lab.experiments.phases import step_up
    from lab.experiments.phases_words import kept_growing, more_users_answer, step_of

    rows = [{"workload": "decode", "engine": e, "users": u, "repeat": r, "output_tok_s": tok_s}
            for e, base in (("hf", 10.0), ("vllm", 20.0)) for r in range(3)
            for u, tok_s in ((1, base), (3, base * 2.5 + r))]
    first = {e: {"gain": 2.5, "gain_spread": {"low": 2.5, "high": 2.6, "n": 3}} for e in ("hf", "vllm")}

    def exercise(vllm_tok_s):  # the new level's repeats, as session.run returns them
        summaries = [SimpleNamespace(engine=e, users=6, repeat=r, output_tok_s=tok_s)
                     for e, values in (("hf", (26, 26, 27)), ("vllm", vllm_tok_s)) for r, tok_s in enumerate(values)]
        plan = SimpleNamespace(engines=("hf", "vllm"), load=SimpleNamespace(users=(6,)))
        return step_up(rows, SimpleNamespace(plan=plan, summaries=lambda: summaries))

    cases = {"grew": (80, 84, 88), "flat": (51, 49, 52), "straddle": (70, 78, 82), "fell": (40, 41, 39)}
    said = {name: " ".join(more_users_answer(first, exercise(v), (3, 6))) for name, v in cases.items()}
    grew = exercise(cases["grew"])["vllm"]
    assert grew["step_spread"] == {"low": 80 / 50, "high": 88 / 52, "n": 3} and grew["gain"] == 84 / 20
    assert grew["tok_s"] == {6: 84.0} and exercise(cases["grew"])["hf"]["step"] == 26 / 26
    assert "so it kept growing" in said["grew"] and "repeats 1.60-1.69x, n=3" in said["grew"]
    assert "HF" in said["grew"] and "HF" not in more_users_answer(first, {"vllm": grew}, (3, 6))[0]  # vLLM alone
    assert "no measured tok/s (the repeats straddle 1), so it flattened" in said["flat"]
    assert "cannot say whether it kept growing or flattened" in said["straddle"]
    assert "flattened" not in said["straddle"].split("cannot say")[0] and "kept growing" not in said["straddle"].split(
        "cannot say")[0]
    assert "it even fell, in every repeat, so it flattened" in said["fell"]
    assert [kept_growing(step_of(first["vllm"], exercise(v)["vllm"]), (3, 6)) for v in cases.values()] == [
        True, False, None, False]


def test_the_capacity_exercise_sets_the_guess_against_the_found_ratio_by_its_bound():
    """03's capacity exercise on recorded searches that disagree: an exact ratio, a lower bound, and none."""
    from lab.capacity.words import capacity_guess_answer, guess_line

    exact, bound = {"value": 4.0, "bound": "exact"}, {"value": 4.0, "bound": "at_least"}
    assert guess_line(3, exact).endswith("your guess was below it, 0.75x what was found.")
    assert "computed from its measured probes" in guess_line(3, exact)
    assert guess_line(4.2, exact).endswith("matched it (within 10%).")
    assert "could still find 8x" in guess_line(8, bound) and "at least 4x" in guess_line(8, bound)
    assert "below what was found, even as a bound" in guess_line(2, bound)
    assert guess_line(None, bound).startswith("You left your prediction blank; the capacities")
    assert "no ratio" in guess_line(5, {"value": None, "bound": "none"})
    probe = {"engine": "hf", "level": 2, "repeat": 0, "values": {"ttft_p95": 6.1}, "little": {}}
    data = {"engines": ["hf", "vllm"], "unit": "users", "mode": "users", "probes": [probe],
            "targets": [{"name": "ttft_p95", "metric": "ttft", "percentile": 95.0, "limit_s": 2.0}],
            "capacity": {"hf": {"value": 1, "bound": "exact", "failed_at": 2, "ended": "done", "unit": "users"},
                         "vllm": {"value": 4, "bound": "at_least", "failed_at": None, "ended": "done",
                                  "unit": "users"}},
            "ratios": {"vllm/hf": bound}}
    lines = capacity_guess_answer(2, data)
    assert "even as a bound" in lines[0] and "HF served 1 user (2 users missed it)" in lines[1]
    assert any("HF broke the target first on TTFT p95 (6.1 s against 2 s) at 2 users" in line for line in lines)


def test_sweep_answers_say_when_the_repeats_overlap():
    from lab.sweeps.words import batch_answer, blocks_answer

    def point(value, tok_s, low, high, **more):
        return {"value": value, "output_tok_s@4": tok_s, "output_tok_s_spread@4": {"low": low, "high": high, "n": 3},
                **more}

    def batch(value, tok_s, low, high):
        return point(value, tok_s, low, high, **{"kv_peak_reserved_bytes@4": value * 2**20})

    faster = " ".join(batch_answer([batch(1, 20, 19, 21), batch(4, 40, 38, 42)], "4"))
    same = " ".join(batch_answer([batch(1, 20, 18, 23), batch(4, 21, 19, 24)], "4"))
    assert "20.0 tok/s at 1 (repeats 19.0-21.0, n=3)" in faster and "it bought tokens" in faster
    assert "overlap within their repeats' spread" in same and "bought tokens" not in same
    blocks = [point(64, 30, 29, 31, kv_total_blocks=182, kv_block_size=64),
              point(128, 33, 32, 34, kv_total_blocks=91, kv_block_size=128)]
    said = " ".join(blocks_answer(blocks, "4"))
    assert "182 of 64 tokens, 91 of 128 tokens" in said and "same tokens" in said and "128 tokens were fastest" in said


# Two recorded KV-budget sweeps on an H100 (docs/results/h100-speed, 64 users x 2 requests of `mixed`): the 135M
# shape's, whose small pools filled and preempted, and the roomy end of the first 8B sweep, where no pool filled.
def recorded_sweep(name: str) -> dict:
    return json.loads((ROOT / "docs/results/h100-speed" / name / "sweep.json").read_text())


def test_the_pool_sweep_says_where_the_pool_filled_and_preemption_began():
    from lab.sweeps.words import sweep_answer

    tight = " ".join(sweep_answer(recorded_sweep("135m-kvsweep")))
    roomy = recorded_sweep("first-sweeps/8b-kvsweep")
    roomy["points"] = [p for p in roomy["points"] if p["value"] >= 3]
    said = " ".join(sweep_answer(roomy))
    assert "filled up to 0.3 GiB; from 0.7 GiB it had room" in tight and "peak used 1,426 blocks" in tight
    assert "(54 at 0.1 GiB, 46 at 0.3 GiB)" in tight and "none from 0.7 GiB up" in tight
    assert "No pool filled" in said and "preempted" not in said and "1,446 of 1,536, 1,446 of 2,304" in said
    share = recorded_sweep("135m-kvsweep") | {"knob": "gpu_memory_utilization"}  # the same points, said per share
    assert "none from 0.7 of the card up" in " ".join(sweep_answer(share))
    unread = recorded_sweep("135m-kvsweep")
    for point in unread["points"]:
        point["preemptions@64"] = None  # vLLM's counter never read: no words about preemption
    assert "preempt" not in " ".join(sweep_answer(unread)).replace("peak", "")


# Two recorded prefix runs on this CPU (4 requests, 1 user, blocks of 128): 384 shared tokens in 3 turns, where the
# constant-first order hit the cache and TTFT fell; 64 shared tokens once, where nothing hit and TTFT did not move.
def prefix_run(hit_first, blocks, ttft_first, ttft_last, low, high, n, shared_hits):
    def order(rate, computed_rate, ttft, full):
        return {"hit_rate": rate, "queried_tokens": 5184 if n == 3 else 448, "ttft_p50_s": ttft,
                "computed": {"hit_tokens": shared_hits, "hit_rate": computed_rate, "full_blocks": full}}

    return {"first": order(hit_first, hit_first, ttft_first, blocks), "last": order(0.0, 0.0, ttft_last, 0),
            "ttft_last_over_first": ttft_last / ttft_first, "block_size": 128,
            "ttft_ratio_spread": {"low": low, "high": high, "n": n}}


LONG = prefix_run(2 / 3, 3, 0.0509, 0.2804, 5.17, 5.60, 3, 1152)
SHORT = prefix_run(0.0, 0, 0.0785, 0.0771, 0.98, 0.98, 1, 0)


def test_the_prefix_answers_follow_the_hits_and_the_ttft_spread():
    from lab.experiments.prefix_words import prefix_answer, short_prefix_answer, ttft_words

    long = " ".join(prefix_answer(LONG, 384))
    assert "Constant block first: 67% of the 5,184 prompt tokens looked up hit the cache (measured); the block rule " \
           "gives 67% (computed): the two agree." in long
    assert "So the constant-first order found 67%" in long
    assert "5.51x (measured; each order's median over its repeats; the paired repeats' ratios 5.17-5.60x, n=3)" in long
    short = " ".join(prefix_answer(SHORT, 64))
    assert "found no more cached (0%) than the last" in short and "the constant-last order was not slower" in short
    straddle = {**LONG, "ttft_ratio_spread": {"low": 0.9, "high": 1.3, "n": 3}}
    assert "the repeats straddle 1" in ttft_words(straddle)
    exercise = " ".join(short_prefix_answer(SHORT, LONG, (64, 384)))
    assert "0% hit with 64 shared tokens, 67% with 384" in exercise and "fill no full block of 128" in exercise
    fewer = {**LONG, "first": {**LONG["first"], "hit_rate": 0.4}}
    assert "fewer hit than the rule allows" in prefix_answer(fewer, 384)[0]


def test_the_sharing_a_device_answers_follow_the_measured_peaks():
    from lab.experiments.memory_words import plan_answer
    from lab.experiments.preemption_words import preemption_answer
    from lab.experiments.sharing_words import more_answers, sharing_answer

    def sharing(n, one, many, hits):
        return {"one": {"peak_blocks": one}, f"n={n} in one request": {"peak_blocks": many},
                f"{n} separate requests": {"prefix_hit_tokens": hits}, "unshared_blocks_estimate": n * one}

    shared = " ".join(sharing_answer(sharing(4, 5, 8, 384), 4))
    unshared = " ".join(sharing_answer(sharing(4, 1, 4, 0), 4))
    assert "held 12 fewer blocks than unshared copies" in shared and "nothing was shared" in unshared
    assert "added 0.8 blocks against 5" in " ".join(more_answers(sharing(4, 5, 8, 0), sharing(8, 5, 11, 0), (4, 8)))
    plan = {"kv_bytes_planned": 2**29, "kv_bytes_per_token": 23040, "block_size": 128, "kv_blocks_planned": 182,
            "max_model_len": 2048, "max_len_requests_at_once": 11, "notes": []}
    assert "11 full-length requests fit" in " ".join(plan_answer(plan, "cpu"))
    gpu, cpu = " ".join(plan_answer(plan, "cuda")), " ".join(plan_answer(plan, "cpu"))
    assert "total memory" in gpu and "total memory" not in cpu

    def pool(blocks, preemptions, tok_s):
        return {"kv_blocks": blocks, "completed": 10, "errors": 0, "preemptions": preemptions, "output_tok_s": tok_s,
                "peak_waiting": 6}

    hit = " ".join(preemption_answer({"small": pool(17, 3, 20.0), "normal": pool(91, 0, 40.0),
                                      "preemption_mode": "recompute"}, "slow"))
    calm = " ".join(preemption_answer({"small": pool(17, 0, 40.0), "normal": pool(91, 0, 39.0),
                                       "preemption_mode": "recompute"}, None))
    assert "vLLM preempted one" in hit and "0.50x the normal pool's tok/s: with fewer blocks" in hit
    assert "nothing was preempted" in calm and "no slower here" in calm


def test_the_block_count_answer_names_the_side_that_counted_more_and_only_where_they_parted():
    fields = {"samples": 40, "max_abs_diff_blocks": 1, "agree": True, "peak_used_blocks": 9, "num_blocks": 91,
              "vllm_ahead": True}
    assert "At the widest gap vLLM counted more" in block_count_answer(fields)[1]
    behind = block_count_answer({**fields, "max_abs_diff_blocks": 3, "vllm_ahead": False})[1]
    assert "the derived count counted more" in behind and "several requests crossed" in behind
    assert block_count_answer({**fields, "max_abs_diff_blocks": 0})[1] == "They agreed at every step sampled."
    assert "nothing to compare" in block_count_answer({**fields, "samples": 0})[0]
