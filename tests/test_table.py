"""vLLM's block table step by step (lab.experiments.table, lab.plots.kv.block_table_view, lab.experiments.table_words),
on a recorded run: the ids vLLM gave 8 requests of 4 users over 126 engine steps
(docs/results/cpu-experiments/table)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.experiments import stored_fields
from lab.experiments.table import most_holders, shared_prefix, step_view, summarize
from lab.experiments.table_words import table_answer
from lab.plots.kv import POOL_COLUMNS, block_table_view

RECORDED = Path(__file__).resolve().parents[1] / "docs/results/cpu-experiments/table/experiment.json"


def recorded(drop=()) -> SimpleNamespace:
    """The recorded result as the report reads it; ``drop``: keys an older result lacks, in its fields and steps."""
    data = json.loads(RECORDED.read_text())
    steps = [{k: v for k, v in s.items() if k not in drop} for s in data["series"]["steps"]]
    fields = {k: v for k, v in stored_fields(data).items() if k not in drop}
    return SimpleNamespace(experiment="table", fields=fields, series={"steps": steps}, engine_args=data["engine_args"])


def held_before(steps, step) -> set:
    return {b for s in steps[:step] for ids in s["tables"].values() for b in ids}


def pool_label(fig, block) -> str:
    return fig.data[1].text[block // POOL_COLUMNS][block % POOL_COLUMNS]


def test_the_view_draws_vllms_own_ids_at_the_chosen_step_with_their_reference_counts():
    result = recorded()
    steps = result.series["steps"]
    fig, said = block_table_view(result, 71)
    now = steps[71]
    logical = [[int(cell.split("<br>")[0].split()[0]) for cell in row if cell] for row in fig.data[0].text]
    assert logical == list(now["tables"].values())  # row r, column i: request r's logical block i -> its id
    for request, ids in now["tables"].items():
        assert all(pool_label(fig, b) == f"{b}<br>{request}" for b in ids if str(b) not in now["shared"])
    assert {str(b): pool_label(fig, b) for b in map(int, now["shared"])} == {
        b: f"{b}<br>x{n}" for b, n in now["shared"].items()} == {"1": "1<br>x4", "2": "2<br>x4"}
    freed = sorted(held_before(steps, 71) - {b for ids in now["tables"].values() for b in ids})
    assert all(pool_label(fig, b) == f"{b}<br>freed" for b in freed) and freed == [3, 4, 5, 6, 7, 8, 12]
    free = [b for b in range(1, 48) if "<br>" not in pool_label(fig, b) or "freed" in pool_label(fig, b)]
    assert len(free) == now["free"] == 31  # the cells drawn free are vLLM's own free count
    assert said.startswith("After step 71, 4 requests hold 16 blocks; blocks 1 and 2 are each held by 4 at once "
                           "(logical blocks 0-1 of each: prompt tokens 0-63")
    assert "7 blocks freed earlier are back on the free list (3, 4, 5, 6, 7, 8, 12)" in said
    assert "vLLM counts 31 free blocks" in said and "measured" in said
    assert "engine step 71 of 125" in fig.layout.title.text


def test_each_steps_sentence_follows_its_own_step():
    result = recorded()
    first, late, ended = (block_table_view(result, step)[1] for step in (0, 124, 125))
    assert "no block freed earlier is free now" in first and "held by 4 at once" in first
    assert "the run's most" not in first  # this step is the most
    assert late.startswith("After step 124, 1 request holds 6 blocks; no block is shared at this step (the run's "
                           "most: 4 held block 1 after step 0); 17 blocks freed earlier are back on the free list")
    assert "3 held now served another request before (1, 2, 23); vLLM counts 41 free blocks" in late
    assert ended.startswith("After step 125 no request holds a block") and "vLLM counts 47 free blocks" in ended


def test_the_most_holders_at_once_is_the_most_over_steps_not_the_last_steps_count():
    result = recorded()
    assert result.fields["most_holders"] == {"holders": 4, "block": 1, "step": 0}
    assert result.fields["shared"] == {"1": 4, "2": 4}
    assert "held by several requests at once, up to 4 at once (block 1 after step 0)" in " ".join(
        table_answer(result.fields))
    fading = [{"step": 0, "tables": {"a": [1], "b": [1, 2], "c": [1, 3]}, "shared": {"1": 3}},
              {"step": 1, "tables": {"a": [1, 4], "b": [1, 2]}, "shared": {"1": 2}}]
    fields = summarize({"steps": fading, "num_blocks": 8, "block_size": 32})
    assert fields["shared"] == {1: 3} and fields["most_holders"] == {"holders": 3, "block": 1, "step": 0}
    assert most_holders([{"step": 0, "tables": {"a": [1, 2]}, "shared": {}}]) == {"holders": 1, "block": 1, "step": 0}


def test_an_older_result_without_the_new_keys_still_reads():
    """Stored before this view: no most_holders, no tokens or free count per step, shared per block at the last
    step it was shared. Its sentences say what it holds; its view draws without the slots filled."""
    old = recorded(drop=("most_holders", "tokens", "free"))
    said = " ".join(table_answer(old.fields))
    assert "older result" in said and "up to" not in said
    fig, line = block_table_view(old, 71)
    assert "vLLM counts" not in line and "held by 4 at once" in line
    assert not any("/32" in cell for row in fig.data[0].text for cell in row)


def test_a_step_the_run_lacks_is_refused_by_its_range_and_the_prefix_is_exactly_shared_tokens():
    result = recorded()
    with pytest.raises(ValueError, match="step 126 is not one of this run's engine steps: choose 0 to 125"):
        block_table_view(result, 126)
    assert step_view(result.series["steps"], 71)["reused"] == [1, 2, 17]
    assert result.engine_args["vllm"]["num_kv_blocks"] == 48 and result.engine_args["vllm"]["block_size"] == 32
    from lab.engines.base import GenRequest

    two = shared_prefix([GenRequest("a", (1, 2, 3), 4), GenRequest("b", (5, 6), 4)], 5)
    assert [r.prompt_token_ids for r in two] == [(1, 2, 3, 5, 6, 1, 2, 3), (1, 2, 3, 5, 6, 5, 6)]
