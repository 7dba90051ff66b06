"""bench.paired's turn orders and intervals, the reports and summaries that bench.lab_vs_offline_vllm and
bench.dashboard_overhead read back for --pool, and bench.viewers' verdict."""

import gzip
import json
from itertools import combinations

import pytest

from bench.lab_vs_offline_vllm import pooled, report
from bench.paired import geometric_interval, turn_order


def test_over_twice_as_many_rounds_as_sides_the_turns_balance():
    sides = ["offline", "engine", "served", "bare"]
    rows = [turn_order(sides, round_) for round_ in range(2 * len(sides))]
    assert all(sorted(row) == sorted(sides) for row in rows)
    assert {side: sum(row[0] == side for row in rows) for side in sides} == dict.fromkeys(sides, 2)
    assert all(sum(row.index(a) < row.index(b) for row in rows) == 4 for a, b in combinations(sides, 2))


def test_the_interval_needs_four_rounds_and_holds_the_geometric_mean():
    assert geometric_interval([0.5, 2.0, 1.0]) == (1.0, None, None)
    mean, low, high = geometric_interval([0.9, 1.1, 0.95, 1.05])
    assert low < mean < high and abs(mean - (0.9 * 1.1 * 0.95 * 1.05) ** 0.25) < 1e-9


def test_saved_reports_pool_their_rounds_and_a_pooled_report_is_left_out(tmp_path):
    one = {"offline": [10.0, 12.0], "engine": [9.0, 12.0]}
    two = {"offline": [11.0], "engine": [10.0], "bare": [5.0]}
    paths = []
    for index, rates in enumerate((one, two)):
        paths.append(tmp_path / f"r{index}.txt")
        paths[-1].write_text("\n".join(report(rates, "heading")))
    (tmp_path / "pooled.txt").write_text("\n".join(report(one, "2 reports pooled: 2 rounds")))
    rates = pooled([str(p) for p in [*paths, tmp_path / "pooled.txt"]])
    assert rates == {"offline": [10.0, 12.0, 11.0], "engine": [9.0, 12.0, 10.0]}  # bare: not in every report


def test_dashboard_overhead_pools_plain_and_gzipped_summaries_with_rounds_numbered_on(tmp_path):
    from bench.dashboard_overhead import pooled as pooled_sides
    run = {"round": 0, "repeat": 0, "engine": "vllm", "users": 64, "output_tok_s": 100.0}
    saved = json.dumps({"cli": {"runs": [run, {**run, "round": 1, "repeat": 1}]}})
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (tmp_path / "a" / "summaries.json").write_text(saved)
    (tmp_path / "b" / "summaries.json.gz").write_bytes(gzip.compress(saved.encode()))
    runs = pooled_sides([str(tmp_path / "a"), str(tmp_path / "b")])["cli"]["runs"]
    assert [run["round"] for run in runs] == [0, 1, 2, 3] and [run["repeat"] for run in runs] == [0, 1, 2, 3]
    with pytest.raises(SystemExit, match="no summaries.json"):
        pooled_sides([str(tmp_path)])


def test_viewers_verdict_pools_a_count_measured_twice_before_and_after_the_most_viewers():
    from bench.viewers import verdict

    def block(viewers, *rates):
        runs = [{"engine": "hf", "users": 1, "repeat": i, "output_tok_s": rate} for i, rate in enumerate(rates)]
        return {"viewers": viewers, "runs": runs, "new_page_s": [0.1]}

    lines = verdict([block(1, 26.0, 26.2), block(50, 25.0, 25.2), block(1, 24.9, 25.3)]).splitlines()
    assert lines[0] == "hf@1: 25.1 with 50 viewers vs [24.9-26.2] with 1: within"  # the drift between the 1s
    assert verdict([block(1, 26.0, 26.2), block(50, 25.0, 25.2)]).startswith("hf@1: 25.1 with 50 viewers vs "
                                                                              "[26.0-26.2] with 1: OUTSIDE, below")
    assert verdict([block(1, 26.0, 26.2), block(50, 27.0)]).splitlines()[0].endswith("OUTSIDE, above")
