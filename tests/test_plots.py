"""Figures and tables of lab/plots/__init__.py on a finished fake run and on runs with nothing measured yet."""

import asyncio
from dataclasses import replace

import pytest

from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.plots import (
    EMPTY_WORDS,
    ENGINE_LABELS,
    compare_figure,
    compare_ratio_figure,
    kv_tokens_figure,
    latency_table,
    queue_figure,
    ratio_bars,
    run_span_s,
    throughput_figure,
    tok_s_bars,
    vllm_kv_figure,
)
from lab.runs import LevelResult, RunResult, execute, summary_dict
from tests.test_driver import fake_result

LATENCY_COLUMNS = [f"{m} {q}" for m in ("TTFT", "TPOT", "E2E") for q in ("p50", "p90", "p99")]


class KVFake(FakeEngine):
    """A fake engine whose samples carry the KV fields the real engine of its name fills."""

    async def start(self):
        info = await super().start()
        if self.name == "vllm":
            return replace(info, kv_total_blocks=64, kv_block_size=16)
        return replace(info, kv_bytes_per_token=1024)

    def drain_samples(self):
        if self.name == "vllm":
            return [replace(s, kv_usage=0.25, kv_total_blocks=64, kv_block_size=16) for s in super().drain_samples()]
        return [replace(s, kv_reserved_bytes=2 * 2**20, kv_real_bytes=2**20) for s in super().drain_samples()]


def plan(engines=("hf", "vllm"), **load):
    return RunPlan(engines=engines, load=LoadConfig(**{"users": (1, 2), "requests_per_user": 2, "output_len": 4,
                                                       "warmup_requests": 0, **load}))


def fake_run(tokenizer, engine=KVFake, engines=("hf", "vllm"), **load) -> RunResult:
    """A finished run of fake engines (KV-sampling ones by default)."""
    started = {name: engine(name) for name in engines}
    result = fake_result(plan(engines, **load), started)
    return asyncio.run(execute(result.plan, started, tokenizer, result))


def empty_run() -> RunResult:
    return RunResult(plan=plan(), model="fake", model_path="fake", device={"kind": "cpu"}, versions={})


def starting_run() -> RunResult:
    """A run whose first level has begun but measured nothing yet."""
    result = empty_run()
    result.levels.append(LevelResult(engine="hf", users=1, planned=2))
    return result


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)


@pytest.fixture
def run(char_tokenizer):
    return fake_run(char_tokenizer)


def test_live_figures_of_a_finished_run(run):
    throughput = throughput_figure(run)  # one panel per level, both engines in each, from the level's start
    assert [t.name for t in throughput.data] == [ENGINE_LABELS["hf"], ENGINE_LABELS["vllm"]] * 2
    assert [t.showlegend for t in throughput.data] == [True, True, False, False]
    assert [a.text for a in throughput.layout.annotations] == ["1 user", "2 users"]
    assert all(t.x[0] == 0 for t in throughput.data) and "tok/s" in throughput.layout.title.text
    span = run_span_s(run)  # the other time plots share the run's range; vLLM's KV plot runs on vLLM's own clock
    assert all(list(f(run).layout.xaxis.range) == [0, span] for f in (kv_tokens_figure, queue_figure))
    vllm = vllm_kv_figure(run)
    assert [t.name for t in vllm.data] == ["blocks used", "blocks total"]
    levels = [lvl for lvl in run.levels if lvl.engine == "vllm"]  # end to end: vLLM's levels' own seconds
    own = sum(lvl.samples[-1].time_s - lvl.samples[0].time_s for lvl in levels)
    assert vllm.data[0].x[0] == 0 and abs(vllm.data[0].x[-1] - own) < 1e-9 and own < span
    assert "64 blocks x 16 tokens" in vllm.layout.title.text
    assert set(vllm.data[0].y) == {16}  # 0.25 x 64 blocks
    kv = kv_tokens_figure(run)  # both engines in tokens: HF's bytes / bytes per token, vLLM's blocks x block size
    assert [t.name for t in kv.data] == ["HF: held", "HF: real tokens", "vLLM: held", "vLLM: real tokens"]
    assert set(kv.data[0].y) == {2048} and set(kv.data[1].y) == {1024} and set(kv.data[2].y) == {16 * 16}
    queue = queue_figure(run)
    assert len(queue.data) == 4 and "running / waiting" in queue.layout.title.text


def test_summary_figures_of_a_finished_run(run):
    summary = summary_dict(run)
    bars = tok_s_bars(summary)
    assert [t.name for t in bars.data] == [ENGINE_LABELS["hf"], ENGINE_LABELS["vllm"]]
    assert all(list(t.x) == ["1", "2"] for t in bars.data)
    assert "per user level" in bars.layout.title.text
    ratio = ratio_bars(summary)
    assert len(ratio.data) == 1 and list(ratio.data[0].x) == ["1", "2"]
    assert "vLLM / HF" in ratio.layout.title.text and ratio.data[0].text[0].endswith("x*")  # 2 requests: noisy
    for fig in (bars, ratio):  # user levels are categories (1, 4, 8 stay 1, 4, 8), not a numeric axis
        assert fig.layout.template.layout.autotypenumbers == "strict"
    assert "under 10 requests per engine" in ratio.layout.title.text
    assert bars.data[0].error_y.array is None and ratio.data[0].error_y.array is None  # no repeats: no whiskers
    table = latency_table(summary)
    assert len(table) == 4 and list(table["engine"]) == ["hf", "vllm", "hf", "vllm"]
    assert set(LATENCY_COLUMNS) <= set(table.columns) and table["errors"].sum() == 0


def test_repeats_draw_means_with_whiskers_and_one_table_row_each(char_tokenizer):
    summary = summary_dict(fake_run(char_tokenizer, users=(5,), requests_per_user=2, repeats=2))
    assert [(r["engine"], r["repeat"]) for r in summary["runs"]] == [("hf", 0), ("vllm", 0), ("hf", 1), ("vllm", 1)]
    assert summary["spread"]["hf"]["5"]["n"] == 2 and summary["spread"]["ratio"]["5"]["n"] == 2
    bars, ratio = tok_s_bars(summary), ratio_bars(summary)
    assert all(list(t.x) == ["5"] and len(t.error_y.array) == 1 for t in bars.data)
    assert bars.data[0].y[0] == pytest.approx(summary["spread"]["hf"]["5"]["mean"])
    assert len(ratio.data[0].error_y.arrayminus) == 1 and ratio.data[0].text == ("{:.2f}x".format(
        summary["ratio"]["5"]),)  # 2 repeats x 10 requests: enough to trust
    assert list(latency_table(summary)["repeat"]) == [1, 1, 2, 2]


def test_compare_figures(run, char_tokenizer):
    summaries = [summary_dict(run), summary_dict(fake_run(char_tokenizer))]
    bars = compare_figure(summaries)
    assert len(bars.data) == 4 and run.id[:6] in bars.data[0].name
    assert "compared" in bars.layout.title.text
    ratios = compare_ratio_figure(summaries)
    assert len(ratios.data) == 2 and list(ratios.data[0].x) == ["1", "2"]
    assert "Ratio vLLM / HF" in ratios.layout.title.text
    assert len(compare_figure([]).data) == len(compare_ratio_figure([]).data) == 0


@pytest.mark.parametrize("make", [empty_run, starting_run])
def test_nothing_measured_yet_draws_empty_figures(make):
    result = make()
    for figure in (throughput_figure, vllm_kv_figure, kv_tokens_figure, queue_figure):
        assert len(figure(result).data) == 0, figure.__name__
    assert vllm_kv_figure(result).layout.title.text == "vLLM KV-cache blocks"
    empty = vllm_kv_figure(result)  # no bare axes: what will appear there
    assert empty.layout.annotations[0].text == EMPTY_WORDS["vllm_kv"] and empty.layout.yaxis.visible is False
    summary = summary_dict(result)
    bars = [text for t in tok_s_bars(summary).data for text in t.text]
    assert bars == ["running"] * len(result.levels)  # a level begun is drawn as running, not as a 0 bar
    ratio = ratio_bars(summary)
    assert len(ratio.data) == 0 and ratio.layout.annotations[0].text == EMPTY_WORDS["ratio"]
    assert not ratio.layout.shapes  # not even the 1.0 line on made-up axes
    assert len(latency_table(summary)) == len(result.levels)
    assert list(latency_table({"runs": []}).columns)[:2] == ["engine", "users"]  # named headers, even empty
    assert len(compare_figure([summary]).data) == 0 and len(compare_ratio_figure([summary]).data) == 0


def test_a_cancelled_level_shows_what_it_measured_and_says_so():
    rows = [{"engine": "hf", "users": 1, "repeat": 0, "status": "ok", "completed": 2, "output_tok_s": 10.0},
            {"engine": "hf", "users": 4, "repeat": 0, "status": "cancelled", "completed": 1, "output_tok_s": 20.0},
            {"engine": "vllm", "users": 1, "repeat": 0, "status": "cancelled", "completed": 0, "output_tok_s": 0.0}]
    bars = tok_s_bars({"engines": ["hf", "vllm"], "runs": rows})
    assert list(bars.data[0].text) == ["10", "20 (cancelled)"] and list(bars.data[1].text) == ["cancelled"]
    assert list(bars.data[0].marker.pattern.shape) == ["", "/"]


def test_one_engine_has_no_ratio(char_tokenizer):
    summary = summary_dict(fake_run(char_tokenizer, engines=("vllm",)))
    assert summary["ratio"] == {} and len(ratio_bars(summary).data) == 0  # an empty state, no bare axes
    assert len(tok_s_bars(summary).data) == 1 and len(latency_table(summary)) == 2


def test_kv_tokens_figure_of_samples_without_kv_figures(char_tokenizer):
    assert len(kv_tokens_figure(fake_run(char_tokenizer, engine=FakeEngine)).data) == 0


def test_vllm_served_and_its_engine_loop_are_told_apart(char_tokenizer):
    summary = summary_dict(fake_run(char_tokenizer, engines=("vllm", "vllm-engine")))
    bars = tok_s_bars(summary)
    assert [t.name for t in bars.data] == [ENGINE_LABELS["vllm"], ENGINE_LABELS["vllm-engine"]]
    assert "per-token cost of vLLM's async front end" in bars.layout.title.text
    assert set(summary["ratios"]) == {"vllm-engine/vllm"}  # no HF: the second engine over the first
    assert ratio_bars(summary).data[0].name == "vLLM-engine / vLLM"


def test_a_long_step_line_is_thinned_and_keeps_its_peaks():
    from lab.plots import MAX_POINTS, step_line

    xs = list(range(10 * MAX_POINTS))
    ys = [0] * len(xs)
    ys[1234] = 99
    line = step_line(xs, ys)
    assert len(line.x) <= MAX_POINTS and max(line.y) == 99 and line.x[0] == 0
    short = step_line([0, 1], [3, None])
    assert list(short.y) == [3, None]


def test_the_kv_title_says_when_the_lab_sized_vllms_pool(run):
    """On CUDA with no KV budget the pool is the Workshop demo's top level (the memory plan's sizing, recorded in
    the engine args): the title says so; a pool the user sized is only counted."""
    import dataclasses

    from lab.config import EngineConfig
    from lab.memory import DEMO_SIZED, pool_blocks
    from lab.plots import pool_title

    blocks, sized_by = pool_blocks(EngineConfig(device="cuda"))
    vllm = run.engine_info["vllm"]
    cuda = dataclasses.replace(run, plan=dataclasses.replace(run.plan, engine=EngineConfig(device="cuda")))
    cuda.engine_info = {**run.engine_info, "vllm": dataclasses.replace(
        vllm, kv_total_blocks=blocks, args={**vllm.args, "source": {"num_kv_blocks": sized_by}})}
    assert sized_by == DEMO_SIZED
    assert pool_title(cuda).endswith(f"{blocks} blocks x 16 tokens (the Workshop demo's top level on average, "
                                     "computed)")
    assert pool_title(run).endswith("64 blocks x 16 tokens")
