"""The results database: runs saved (partial ones too), listed, loaded and exported like the CLI's files."""

import asyncio
import json

import pytest

from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.runs import RunResult, execute, summary_dict, write_run
from lab.store import export_run, list_runs, load_summary, run_label, save
from tests.test_driver import fake_result


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)


def plan(users=(1, 2), requests_per_user=2):
    return RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=users, requests_per_user=requests_per_user,
                                                           output_len=4, warmup_requests=0))


def finished_run(tokenizer, started_at=None) -> RunResult:
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")}
    result = fake_result(plan(), engines)
    if started_at:
        result.started_at = started_at
    return asyncio.run(execute(result.plan, engines, tokenizer, result))


def cancelled_run(tokenizer) -> RunResult:
    """A run cancelled as soon as its first level has measured a request."""
    engines = {"hf": FakeEngine("hf", token_delay_s=0.002), "vllm": FakeEngine("vllm", token_delay_s=0.002)}
    result = fake_result(plan(requests_per_user=50), engines)

    async def main():
        task = asyncio.ensure_future(execute(result.plan, engines, tokenizer, result))
        while not any(lvl.records for lvl in result.levels):
            await asyncio.sleep(0.005)
        task.cancel()
        await task

    asyncio.run(main())
    return result


def failed_run(tokenizer) -> RunResult:
    """A run whose vllm engine dies at its first level, after hf measured one."""

    class Dies(FakeEngine):
        async def reset(self):
            if self.name == "vllm":
                raise RuntimeError("engine died")

    engines = {"hf": Dies("hf"), "vllm": Dies("vllm")}
    result = fake_result(plan(), engines)
    return asyncio.run(execute(result.plan, engines, tokenizer, result))


def test_save_list_and_load(tmp_path, char_tokenizer):
    db = tmp_path / "results.sqlite"
    old = finished_run(char_tokenizer, started_at="2024-01-01T00:00:00+00:00")
    new = finished_run(char_tokenizer, started_at="2025-01-01T00:00:00+00:00")
    save(db, old)
    save(db, new)
    rows = list_runs(db)
    assert [r["run_id"] for r in rows] == [new.id, old.id]  # newest first
    row = rows[0]
    assert row["status"] == "ok" and row["model"] == "fake" and row["workload"] == "mixed, 2 req/user, out 4"
    summary = summary_dict(new)
    top = {r["engine"]: r["output_tok_s"] for r in summary["runs"] if r["users"] == 2}
    assert row["users"] == "1,2" and row["top level"] == 2 and row["output len"] == 4 and row["per user"] == "2 req"
    assert (row["HF tok/s"], row["vLLM tok/s"]) == (round(top["hf"], 1), round(top["vllm"], 1))
    assert row["vLLM/HF"] == round(summary["ratio"]["2"], 2) and isinstance(row["vLLM/HF"], float)
    assert "engine args" not in row  # in the detail view
    assert run_label(row).endswith(f"users 1,2 · ok ({new.id})")
    assert load_summary(db, new.id) == json.loads(json.dumps(summary_dict(new)))


def test_unknown_run_is_a_key_error(tmp_path):
    db = tmp_path / "results.sqlite"
    with pytest.raises(KeyError, match="nope"):
        load_summary(db, "nope")
    with pytest.raises(KeyError, match="nope"):
        export_run(db, "nope", tmp_path / "out")


def test_export_writes_the_cli_files(tmp_path, char_tokenizer):
    db = tmp_path / "results.sqlite"
    result = finished_run(char_tokenizer)
    save(db, result)
    exported = export_run(db, result.id, tmp_path / "exported")
    written = write_run(result, tmp_path / "cli")
    assert set(exported) == set(written) == {"summary", "requests"}
    for name, path in exported.items():
        assert path.exists()
        assert path.read_bytes() == written[name].read_bytes(), name
    assert len(exported["requests"].read_text().splitlines()) == 1 + 2 * (2 * 1 + 2 * 2)


@pytest.mark.parametrize("make, status", [(cancelled_run, "cancelled"), (failed_run, "failed")])
def test_partial_runs_are_saved(tmp_path, char_tokenizer, make, status):
    db = tmp_path / "results.sqlite"
    result = make(char_tokenizer)
    assert result.status == status
    save(db, result)
    row = list_runs(db)[0]
    assert row["status"] == status and row["top level"] == 1  # what it measured, not blank
    assert row["HF tok/s"] > 0  # hf measured its first level before the stop
    summary = load_summary(db, result.id)
    assert summary["status"] == status and summary["runs"]
    assert summary["runs"][0]["engine"] == "hf" and summary["runs"][0]["requests"] >= 1
    if status == "failed":
        assert "engine died" in summary["error"]
    csv_lines = export_run(db, result.id, tmp_path / "out")["requests"].read_text().splitlines()
    assert len(csv_lines) > 1


def test_saving_again_updates_the_run(tmp_path, char_tokenizer):
    db = tmp_path / "results.sqlite"
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")}
    result = fake_result(plan(), engines)
    save(db, result)  # as the run starts: no level yet
    assert load_summary(db, result.id)["status"] == "running"
    asyncio.run(execute(result.plan, engines, char_tokenizer, result))
    save(db, result)
    rows = list_runs(db)
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    assert len(load_summary(db, result.id)["runs"]) == 4


def test_an_older_database_moves_into_the_one_table(tmp_path, char_tokenizer):
    """A database written before one table held every kind: its runs, experiments and sweeps are listed as before."""
    import sqlite3

    from lab.store import list_experiments, list_sweeps

    db, run = tmp_path / "old.sqlite", finished_run(char_tokenizer)
    summary = summary_dict(run)
    with sqlite3.connect(db) as conn:
        conn.execute("create table runs (run_id text primary key, started_at text, status text, model text, "
                     "device text, workload text, users text, engines text, summary_json text, requests_csv text)")
        conn.execute("insert into runs values (?,?,?,?,?,?,?,?,?,?)", (run.id, run.started_at, "ok", "m", "cpu",
                     "mixed", "1,2", "hf,vllm", json.dumps(summary, default=str), "engine\n"))
        for table, key, kind in (("experiments", "experiment_id", "kind"), ("sweeps", "sweep_id", "knob")):
            conn.execute(f"create table {table} ({key} text primary key, {kind} text, started_at text, "
                         f"status text, model text, device text, result_json text)")
            conn.execute(f"insert into {table} values ('{table}', 'waste', '2026-01-01', 'ok', 'm', 'cpu', '{{}}')")
    assert [r["run_id"] for r in list_runs(db)] == [run.id]
    assert list_experiments(db, "waste") == [{}] == list_sweeps(db, "waste")
    assert export_run(db, run.id, tmp_path / "out")["requests"].read_text() == "engine\n"
    with sqlite3.connect(db) as conn:
        tables = {name for (name,) in conn.execute("select name from sqlite_master where type = 'table'")}
    assert tables == {"results"}
