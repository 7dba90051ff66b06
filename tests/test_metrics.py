"""Metrics checked with exact numbers on hand-made records."""

import pytest

from lab.engines.base import EngineSample
from lab.load.driver import RequestRecord
from lab.metrics import (
    Spread,
    distribution,
    e2e_s,
    improvement_ratio,
    itls_s,
    percentile,
    ratio_spreads,
    ratios_by_users,
    spread,
    summarize,
    throughput_series,
    tok_s_spreads,
    tpot_s,
    ttft_s,
)
from lab.metrics.kv import kv_summary
from lab.status import RequestStatus


def record(send, tokens, prompt=10, status=RequestStatus.OK, engine="vllm", users=1):
    return RequestRecord(engine=engine, users=users, user_id=0, request_id="r", send_s=send,
                         prompt_tokens=prompt, max_tokens=len(tokens), first_token_s=tokens[0] if tokens else None,
                         end_s=tokens[-1] if tokens else send + 1, token_times_s=list(tokens), status=status)


def test_per_request_latencies():
    r = record(10.0, [10.5, 10.7, 10.9, 11.5])
    assert ttft_s(r) == pytest.approx(0.5)
    assert e2e_s(r) == pytest.approx(1.5)
    assert tpot_s(r) == pytest.approx((11.5 - 10.5) / 3)
    assert itls_s(r) == pytest.approx([0.2, 0.2, 0.6])


def test_tpot_needs_two_tokens():
    assert tpot_s(record(0.0, [1.0])) is None


def test_percentile_interpolates_linearly():
    values = [1, 2, 3, 4]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1 and percentile(values, 100) == 4
    assert percentile([], 50) is None
    d = distribution([4, 1, 3, 2])
    assert (d.mean, d.p50, d.p99) == pytest.approx((2.5, 2.5, 3.97))


def test_summary_counts_completed_requests_over_the_level_window():
    records = [
        record(0.0, [1.0, 2.0, 3.0], prompt=10),          # 3 tokens
        record(1.0, [2.0, 4.0], prompt=20),               # 2 tokens, ends last at 4.0
        record(0.5, [1.5], prompt=5, status=RequestStatus.ERROR),       # errored: not counted in throughput
    ]
    s = summarize(records, "vllm", 3)
    assert s.requests == 3 and s.completed == 2 and s.errors == 1
    assert s.duration_s == pytest.approx(4.0)
    assert s.output_tokens == 5 and s.input_tokens == 30
    assert s.output_tok_s == pytest.approx(5 / 4)
    assert s.total_tok_s == pytest.approx(35 / 4)
    assert s.req_s == pytest.approx(0.5)
    assert s.ttft_s.mean == pytest.approx((1.0 + 1.0) / 2)
    assert s.e2e_s.p50 == pytest.approx(3.0)
    assert s.itl_s.mean == pytest.approx((1.0 + 1.0 + 2.0) / 3)


def test_ratio_per_user_level():
    hf = summarize([record(0.0, [1.0, 2.0], engine="hf")], "hf", 1)
    vllm = summarize([record(0.0, [0.5, 1.0], engine="vllm")], "vllm", 1)
    assert hf.output_tok_s == pytest.approx(1.0) and vllm.output_tok_s == pytest.approx(2.0)
    assert ratios_by_users([hf.to_dict(), vllm.to_dict()]) == {1: pytest.approx(2.0)}
    assert improvement_ratio(5.0, 0.0) is None


def test_repeats_give_a_mean_ratio_and_the_spread_of_paired_ratios():
    rows = [{"engine": "hf", "users": 5, "repeat": 0, "output_tok_s": 10.0},
            {"engine": "hf", "users": 5, "repeat": 1, "output_tok_s": 20.0},
            {"engine": "vllm", "users": 5, "repeat": 0, "output_tok_s": 30.0},
            {"engine": "vllm", "users": 5, "repeat": 1, "output_tok_s": 30.0},
            {"engine": "vllm", "users": 9, "output_tok_s": 7.0}]  # no repeat key: repeat 0; no HF: no ratio
    assert ratios_by_users(rows) == {5: pytest.approx(2.0)}
    assert ratio_spreads(rows) == {5: Spread(2, pytest.approx(2.25), pytest.approx(1.5), pytest.approx(3.0))}
    assert tok_s_spreads(rows)[("hf", 5)] == Spread(2, 15.0, 10.0, 20.0)
    assert tok_s_spreads(rows)[("vllm", 9)].n == 1
    assert spread([]) is None


def test_throughput_series_buckets_tokens_per_second():
    records = [record(0.0, [0.1, 0.2, 1.5]), record(0.0, [2.5])]
    assert throughput_series(records, bucket_s=1.0) == [(0.0, 2.0), (1.0, 1.0), (2.0, 1.0)]


def test_kv_summary_mirrors_vllm_usage_and_hf_waste():
    vllm = [EngineSample("vllm", 0, 1, 0, kv_usage=0.25, kv_total_blocks=100, preemptions_total=1,
                         prefix_queries_total=10, prefix_hits_total=2, prefix_queries=10, prefix_hits=2),
            EngineSample("vllm", 1, 2, 0, kv_usage=0.5, kv_total_blocks=100, preemptions_total=3,
                         prefix_queries_total=30, prefix_hits_total=12, prefix_queries=20, prefix_hits=10)]
    kv = kv_summary(vllm, num_blocks=100, block_size=128)
    assert kv["peak_usage"] == 0.5 and kv["peak_used_blocks"] == 50
    assert (kv["preemptions"], kv["prefix_cache_queries"], kv["prefix_cache_hits"]) == (2, 30, 12)  # first step's too
    idle = [EngineSample("openai", t, 0, 0, kv_usage=0.0, kv_total_blocks=91) for t in (0, 9)]
    assert kv_summary(idle, num_blocks=91)["peak_usage"] is None  # read only before and after: not a peak of 0
    hf = [EngineSample("hf", 0, 2, 0, kv_reserved_bytes=1000, kv_real_bytes=600),
          EngineSample("hf", 1, 2, 0, kv_reserved_bytes=2000, kv_real_bytes=900)]
    kv = kv_summary(hf)
    assert kv["peak_reserved_bytes"] == 2000 and kv["waste_at_peak"] == pytest.approx(0.55)


def test_kv_usage_series_and_waste_of_a_level_that_never_ran():
    from lab.metrics.kv import vllm_usage_series, waste_stats

    assert vllm_usage_series([], []) == []
    assert waste_stats([]) == {"peak": None, "mean": None, "peak_held_tokens": 0}


def test_goodput_fails_a_request_without_a_first_token_but_lets_one_token_pass_tpot():
    from lab.metrics import meets_slo

    one = RequestRecord("e", 1, 0, "r", send_s=0.0, prompt_tokens=4, max_tokens=1, first_token_s=0.2, end_s=0.2,
                        token_times_s=[0.2])
    assert meets_slo(one, (("ttft", 0.5), ("tpot", 0.01)))  # no TPOT with one token: it passes
    none = RequestRecord("e", 1, 0, "r", send_s=0.0, prompt_tokens=4, max_tokens=1, end_s=0.2)
    assert not meets_slo(none, (("ttft", 0.5),))
    late = RequestRecord("e", 1, 0, "r", send_s=1.0, prompt_tokens=4, max_tokens=1, first_token_s=1.2, end_s=1.2,
                         token_times_s=[1.2], scheduled_s=0.5)
    assert not meets_slo(late, (("ttft", 0.5),))  # 0.5 s queued + 0.2 s: counted from the schedule


def _naive_usage_rows(samples, records):
    """vllm_usage_series by its definition: every request's tokens_held at every sample's next sample."""
    from lab.metrics.kv import blocks_held, tokens_held, used_blocks

    nexts = [s.time_s for s in samples[1:]] + [float("inf")]
    return [(s.time_s, used_blocks(s) * s.kv_block_size, sum(tokens_held(r, t) for r in records), used_blocks(s),
             sum(blocks_held(r, t, s.kv_block_size) for r in records), s.running)
            for s, t in zip(samples, nexts, strict=True)]


def _ragged_level():
    """Requests that start, stream and end at different times (one never started, one still running)."""
    records = [record(0.0, [0.1, 0.2, 0.3]), record(0.05, [0.15, 0.25, 0.35, 0.45, 0.55], prompt=20),
               record(0.3, [0.4, 0.6], prompt=3), record(0.5, [])]
    records[-1].end_s = None
    records[1].end_s = None  # in flight: holds its tokens to the end
    samples = [EngineSample("vllm", t / 20, 2, 0, kv_usage=0.01 * (t % 5), kv_total_blocks=100, kv_block_size=2)
               for t in range(14)]
    return samples, records


def test_kv_usage_series_sweeps_the_requests_in_flight_and_matches_its_definition():
    from lab.metrics.kv import vllm_usage_series

    samples, records = _ragged_level()
    assert vllm_usage_series(samples, records) == _naive_usage_rows(samples, records)
    shuffled = samples[::2] + samples[1::2]  # samples out of order: the sweep starts again, same rows
    assert vllm_usage_series(shuffled, records) == _naive_usage_rows(shuffled, records)


def test_a_live_level_computes_only_its_new_kv_rows_and_agrees_with_a_full_computation():
    from lab.runs import LevelResult

    samples, records = _ragged_level()
    level = LevelResult(engine="vllm", users=2, planned=4, sent=records)
    for count in (1, 5, 6, 14):  # samples arrive while the page redraws
        level.samples = samples[:count]
        assert level.kv_held(None) == _naive_usage_rows(samples[:count], records)
    assert level._live[1] == 13  # every row but the last was kept: their next samples are long past


def test_a_live_kv_row_is_kept_only_once_the_sample_after_it_has_settled():
    """A step's tokens and a request's end reach the records a little after the step's sample: rows whose next
    sample is recent are computed again at the next redraw, and see what arrived meanwhile."""
    import dataclasses
    import time

    from lab.runs import LevelResult

    samples, records = _ragged_level()
    now = time.perf_counter()
    recent = [dataclasses.replace(s, time_s=now + s.time_s) for s in samples]
    moved = [dataclasses.replace(r, send_s=now + r.send_s, first_token_s=r.first_token_s and now + r.first_token_s,
                                 end_s=r.end_s and now + r.end_s, token_times_s=[now + t for t in r.token_times_s])
             for r in records]
    level = LevelResult(engine="vllm", users=2, planned=4, sent=moved, samples=recent)
    assert level.kv_held(None) == _naive_usage_rows(recent, moved) and level._live[1] == 0


def test_a_batchs_slots_split_into_the_papers_kinds_of_waste():
    from lab.engines.base import GenRequest
    from lab.engines.hf import _Batch, _Slot, slot_kinds

    def slot(prompt, max_tokens, made, done=False):
        return _Slot(GenRequest("r", (1,) * prompt, max_tokens), out=None, made=made, done=done)

    batch = _Batch([slot(10, 8, 3), slot(6, 4, 3), slot(4, 2, 2, done=True)], padded_len=10, epoch=0, step=3)
    dynamic = slot_kinds(batch, None)  # rows of padded prompt + steps: no reservation, no spare rows
    assert dynamic == {"held": 39, "real": 22, "reservation": 0, "external": 0, "internal": 17}
    static = slot_kinds(_Batch(batch.slots, padded_len=10, epoch=0, step=3, fillers=1), 20)
    assert static == {"held": 80, "real": 22, "reservation": 6, "external": 20, "internal": 32}


def test_kinds_shares_weight_each_kind_by_time_and_paged_engines_waste_only_inside_blocks():
    from lab.metrics.kv import kinds_series, kinds_shares

    hf = [EngineSample("hf", t, 2, 0, kv_reserved_bytes=held, kv_real_bytes=real, kv_reservation_bytes=res,
                       kv_internal_bytes=held - real - res, kv_external_bytes=0)
          for t, held, real, res in ((0, 100, 20, 60), (1, 100, 60, 20), (3, 0, 0, 0))]
    shares = kinds_shares(kinds_series("hf", hf, [], 10))
    assert shares == pytest.approx({"real": 140 / 300, "reservation": 100 / 300, "internal": 60 / 300,
                                    "external": 0.0})
    assert kinds_shares([]) == dict.fromkeys(shares)
    records = [RequestRecord("vllm", 1, 0, "r", send_s=0.0, prompt_tokens=40, max_tokens=2, first_token_s=0.5,
                             end_s=2.0, token_times_s=[0.5, 1.5])]
    vllm = [EngineSample("vllm", t, 1, 0, kv_usage=0.5, kv_total_blocks=2, kv_block_size=64) for t in (1.0, 2.0)]
    rows = kinds_series("vllm", vllm, records, None)  # a step's tokens arrive before the next sample
    assert [row[1:] for row in rows] == [(64, 42, 0, 22, 0), (64, 0, 0, 64, 0)]
