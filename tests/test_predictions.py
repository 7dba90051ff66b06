"""The room's predictions (lab.predictions): answers checked, rounds kept and stored, and the sentence and figure
against recorded runs and ladders that disagree (docs/results). Pure: no engine; the browser test is in test_ui.py."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.predictions import (
    MAX_PAGES,
    RATIO,
    STEP,
    Round,
    histogram,
    ladder_steps,
    new_round,
    parse_answer,
    room_sentence,
    round_words,
)

ROOT = Path(__file__).resolve().parents[1]
ROOM = [2.0, 3.0, 3.0, 4.0, 5.0, 6.0, 30.0]  # seven pages' guesses, median 4.0x


def recorded(path: str) -> dict:
    return json.loads((ROOT / "docs/results" / path).read_text())


def ended(kind: str, answers: list, data: dict, choices: tuple = ()) -> dict:
    """A round of ``answers`` whose task stored ``data`` and ended, as a page sees it."""
    found = Round(kind, choices, {f"page{i}": a for i, a in enumerate(answers)})
    found.attach("run1")
    found.measure(data)
    return found.view()


@pytest.mark.parametrize("raw, expected", [
    (None, "not nothing"), ("", "not nothing"), ("  ", "not nothing"), ("abc", "not 'abc'"), ("nan", "not 'nan'"),
    ("inf", "not 'inf'"), (0.05, "not 0.05"), (2000, "not 2000"), ("-3", "not -3"), ("5000x", "not 5000"),
    (True, "not True"),
])
def test_a_bad_ratio_is_refused_naming_the_value_the_bounds_and_what_it_means(raw, expected):
    with pytest.raises(ValueError, match="from 0.1 to 1000") as refused:
        parse_answer(RATIO, raw, ())
    assert expected in str(refused.value) and "3 means vLLM makes 3x" in str(refused.value)


def test_a_ratio_may_be_typed_with_its_x_and_a_step_must_be_one_of_the_ladders():
    assert [parse_answer(RATIO, raw, ()) for raw in ("3", " 4.5x ", "2×", 0.1, 1000)] == [3, 4.5, 2, 0.1, 1000]
    steps = ladder_steps("cpu")
    assert steps == ("hf → hf-cb", "hf-cb → vllm-hf-code", "vllm-hf-code → vllm")  # CUDA-only rungs merge
    assert len(ladder_steps("cuda")) == 5 and parse_answer(STEP, steps[0], steps) == steps[0]
    with pytest.raises(ValueError, match="choose one of the ladder's steps .*not 'hf → vllm'"):
        parse_answer(STEP, "hf → vllm", steps)
    with pytest.raises(ValueError, match="unknown question 'speed'"):
        new_round("speed", "cpu")


def test_a_page_answers_once_a_second_answer_replaces_it_and_a_closed_round_refuses():
    found = new_round(RATIO, "cpu")
    assert found.answer("a", "3") == "Your prediction: 3.0x."
    assert found.answer("a", 5) == "Your prediction: 5.0x (replaces 3.0x)."
    found.answer("b", 0.5)
    assert found.view()["values"] == [5.0, 0.5] and "2 predictions so far" in round_words(found.view())
    found.attach("run1")
    with pytest.raises(ValueError, match="predictions are closed"):
        found.answer("c", 2)
    assert round_words(found.view()) == ("Predictions closed: 2 predictions for load test run1; the answers show "
                                         "here once it ends.")
    full = Round(RATIO, answers={str(i): 2.0 for i in range(MAX_PAGES)})
    with pytest.raises(ValueError, match=f"holds {MAX_PAGES} predictions"):
        full.answer("late", 2)
    assert full.answer("0", 3) == "Your prediction: 3.0x (replaces 2.0x)."  # a page already counted may change


def test_the_same_room_against_two_recorded_runs_that_disagree():
    """mixed at 8 users on a 2-core EPYC: 4.91x, its two repeats 3.53-5.90x; the H200 demo's top level: 7.95x,
    repeats 7.73-8.18x; a 2-core run of one repeat: 2.24x."""
    cpu = ended(RATIO, ROOM, recorded("cpu-epyc-2core/factors/mixed-8/summary.json"))
    assert cpu["measured"] == pytest.approx(4.905, abs=1e-3)
    assert room_sentence(cpu) == ("7 predictions, median 4.0x (from 2.0x to 30x); measured 4.9x (repeats 3.5x-5.9x): "
                                  "the room's median lies within the measured repeats; 2 of 7 within 20%.")
    gpu = ended(RATIO, ROOM, recorded("h200-factors/demo/summary.json"))
    assert room_sentence(gpu) == ("7 predictions, median 4.0x (from 2.0x to 30x); measured 8.0x (repeats 7.7x-8.2x): "
                                  "the room underestimated by 2.0x; 0 of 7 within 20%.")
    once = ended(RATIO, ROOM, recorded("cpu-epyc-2core/factors/spread-1-4/summary.json"))
    assert room_sentence(once).endswith("measured 2.2x: the room overestimated by 1.8x; 1 of 7 within 20%.")
    near = ended(RATIO, [2.0], recorded("cpu-epyc-2core/factors/spread-1-4/summary.json"))
    assert room_sentence(near).startswith("1 prediction, 2.0x; measured 2.2x: the room's median is within 20%")


def test_a_run_with_no_ratio_or_no_answers_says_so_and_an_unended_round_says_nothing():
    summary = recorded("cpu-epyc-2core/factors/mixed-8/summary.json")
    hf_only = {**summary, "runs": [r for r in summary["runs"] if r["engine"] == "hf"], "spread": {}}
    assert "the run measured no vLLM/HF ratio" in room_sentence(ended(RATIO, ROOM, hf_only))
    assert room_sentence(ended(RATIO, [], summary)) == "No predictions for this load test."
    waiting = new_round(RATIO, "cpu")
    waiting.answer("a", 3)
    assert room_sentence(waiting.view()) == "" and room_sentence(None) == ""
    assert round_words(None).startswith("No predictions open")


def test_the_same_room_against_two_recorded_ladders_that_disagree():
    """On a 2-core EPYC the memory preset's largest step was hf -> hf-cb (1.78x), the spread preset's hf-cb -> vllm
    (1.80x)."""
    room = ["hf → hf-cb", "hf → hf-cb", "hf-cb → vllm", "vllm-hf-code → vllm"]
    memory = ended(STEP, room, recorded("cpu-why/memory/explain.json"), ladder_steps("cpu"))
    assert room_sentence(memory) == ("4 predictions: 2 chose hf → hf-cb, 1 hf-cb → vllm, 1 vllm-hf-code → vllm; "
                                     "measured: the largest step was hf → hf-cb (1.78x, repeats 1.68-1.92x, n=3): "
                                     "2 of 4 right.")
    spread = ended(STEP, room, recorded("cpu-why/spread/explain.json"), ladder_steps("cpu"))
    assert spread["measured"] == "hf-cb → vllm" and room_sentence(spread).endswith("1 of 4 right.")
    straddling = {"factors": [{"lower": "hf", "upper": "hf-cb", "value": 1.1, "low": 0.9, "high": 1.3, "n": 3}]}
    assert room_sentence(ended(STEP, room, straddling)).endswith("so the ladder names no largest step.")


def test_the_histogram_bins_hold_every_answer_and_the_measured_value_on_a_log_scale():
    bins = histogram(ROOM, measured=50.0)
    assert sum(b.count for b in bins) == len(ROOM) and bins[0].low < 2.0 and bins[-1].high > 50.0
    widths = {round(math.log(b.high / b.low), 9) for b in bins}
    assert len(widths) == 1 and len(bins) == 4  # equal on a log scale; sqrt(7) rounded up, + 1
    one = histogram([3.0])
    assert len(one) == 3 and sum(b.count for b in one) == 1 and histogram([]) == []


def test_the_figure_draws_the_rooms_bins_and_the_measured_value_as_a_line():
    from lab.plots.predict import room_figure

    view = ended(RATIO, ROOM, recorded("h200-factors/demo/summary.json"))
    fig = room_figure(view)
    assert sum(fig.data[0].y) == len(ROOM)
    lines = {shape.line.color: shape.x0 for shape in fig.layout.shapes}
    assert lines["#17bebb"] == pytest.approx(math.log10(view["measured"]))  # the measured line
    assert {a.text for a in fig.layout.annotations} == {"measured 8.0x", "room's median 4.0x"}
    ladder = room_figure(ended(STEP, ["hf → hf-cb"], recorded("cpu-why/spread/explain.json"), ladder_steps("cpu")))
    assert list(ladder.data[0].x) == [*ladder_steps("cpu"), "hf-cb → vllm"]  # the measured step, though not a choice
    assert "no predictions" in str(room_figure(ended(RATIO, [], recorded("h200-factors/demo/summary.json"))).layout)


def test_the_host_keeps_a_round_attaches_it_to_the_next_run_and_stores_it_with_the_measured_ratio(tmp_path):
    from lab.app.host import LabHost
    from lab.config import EngineConfig
    from lab.store import load_summary

    host = LabHost(EngineConfig(device="cpu"), db_path=tmp_path / "results.sqlite")
    try:
        assert host.predict("a", 3) == (False, "No predictions are open: the presenter opens them before a run.")
        assert host.open_predictions("ladder")[0] is False
        assert host.open_predictions(RATIO)[0] and host.predict("a", 3)[0] and host.predict("b", "7x")[0]
        assert host.predict("c", 5000) == (False, host.predict("c", "5000")[1])  # refused, the same words
        assert host.predictions()["values"] == [3.0, 7.0]
        assert host.close_predictions() == "Predictions closed: 2 made, kept for the next load test."
        host.open_predictions(RATIO)  # open again: the answers are kept
        assert host.predictions()["values"] == [3.0, 7.0] and host.predictions()["open"]
        summary = recorded("h200-factors/demo/summary.json")
        run = SimpleNamespace(id="run1", KIND="run", status="running", started_at=summary["started_at"],
                              model="m", device={"name": "cpu"}, to_dict=lambda: summary, name=lambda: "mixed")
        host._attach("other", STEP)  # a ladder starts: a ratio round waits for a load test
        host._attach(run.id, RATIO)
        host.keep(run)
        assert load_summary(host.db_path, "run1")["predictions"]["measured"] is None  # a level stored as it goes
        run.status = "ok"
        host.keep(run)
        stored = load_summary(host.db_path, "run1")["predictions"]
        assert stored == {"question": "vLLM/HF output tok/s at the next load test's top user level", "kind": RATIO,
                          "choices": [], "values": [3.0, 7.0], "measured": pytest.approx(7.952, abs=1e-3),
                          "spread": summary["spread"]["ratio"]["64"], "open": False}
        assert room_sentence(host.predictions()) == ("2 predictions, median 5.0x (from 3.0x to 7.0x); measured 8.0x "
                                                     "(repeats 7.7x-8.2x): the room underestimated by 1.6x; 1 of 2 "
                                                     "within 20%.")
    finally:
        host.close()


def test_a_ladder_round_waits_for_a_why_ladder_and_stores_its_largest_step(tmp_path):
    from lab.app.host import LabHost
    from lab.config import EngineConfig
    from lab.store import list_experiments

    host = LabHost(EngineConfig(device="cpu"), db_path=tmp_path / "results.sqlite")
    try:
        host.open_predictions(STEP)
        assert host.predictions()["choices"] == list(ladder_steps("cpu"))
        assert host.predict("a", "hf → hf-cb")[0] and not host.predict("b", "3")[0]
        host._attach("run1", RATIO)  # a load test starts: the ladder's round waits
        assert host.predictions()["task_id"] is None
        fields = recorded("cpu-why/memory/explain.json")
        ladder = SimpleNamespace(id="why1", KIND="experiment", status="ok", started_at=fields["started_at"], model="m",
                                 device={"name": "cpu"}, to_dict=lambda: fields, name=lambda: "why")
        host._attach(ladder.id, STEP)
        host.keep(ladder)
        stored = list_experiments(host.db_path, "why")[0]["predictions"]
        assert (stored["values"], stored["measured"]) == (["hf → hf-cb"], "hf → hf-cb")
        assert room_sentence(host.predictions()).endswith("1 of 1 right.")
    finally:
        host.close()


def test_the_viewers_bench_sets_each_count_with_predictions_against_its_spread_without():
    from bench.viewers import verdict

    def block(predict, *rates):
        runs = [{"engine": "hf", "users": 1, "repeat": i, "output_tok_s": rate} for i, rate in enumerate(rates)]
        return {"viewers": 10, "predict": predict, "runs": runs, "new_page_s": [0.1],
                "predictions": {"values": [2.0] * 10} if predict else None}

    lines = verdict([block(False, 26.0, 26.4), block(True, 26.1, 26.3), block(False, 25.0)]).splitlines()
    assert lines[0].startswith("hf@1: 25.8 with 10 viewers vs [25.0-26.4] with 10")  # the blocks without, pooled
    assert lines[-2:] == ["hf@1: 26.2 with 10 predicting viewers vs [25.0-26.4] without: within",
                          "predictions the run took along: 10"]
