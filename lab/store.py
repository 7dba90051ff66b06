"""Past runs, experiments and sweeps in SQLite: saved as they finish (partial ones too), listed, compared, exported.

Every stored run keeps exactly the files the CLI writes (summary.json and requests.csv), so a run
downloaded from the browser is the same as one written by ``python -m lab bench``.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from contextlib import closing
from pathlib import Path

from lab.metrics import tok_s_spreads
from lab.model import cache_dir
from lab.runs import REQUEST_COLUMNS, RunResult, request_rows, summary_dict

SCHEMA = """
create table if not exists runs (
    run_id text primary key,
    started_at text not null,
    status text not null,
    model text not null,
    device text not null,
    workload text not null,
    users text not null,
    engines text not null,
    summary_json text not null,
    requests_csv text not null
)
"""
EXPERIMENT_SCHEMA = """
create table if not exists experiments (
    experiment_id text primary key,
    kind text not null,
    started_at text not null,
    status text not null,
    model text not null,
    device text not null,
    result_json text not null
)
"""
SWEEP_SCHEMA = """
create table if not exists sweeps (
    sweep_id text primary key,
    knob text not null,
    started_at text not null,
    status text not null,
    model text not null,
    device text not null,
    result_json text not null
)
"""


def default_db_path() -> Path:
    """$KVLAB_CACHE/results.sqlite."""
    return cache_dir() / "results.sqlite"


def connect(db_path: str | Path) -> sqlite3.Connection:
    """Open (and create if needed) the results database."""
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path, timeout=10)
    conn.execute(SCHEMA)
    conn.execute(EXPERIMENT_SCHEMA)
    conn.execute(SWEEP_SCHEMA)
    return conn


def requests_csv_text(result: RunResult) -> str:
    """requests.csv as text."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=REQUEST_COLUMNS)
    writer.writeheader()
    writer.writerows(request_rows(result))
    return buffer.getvalue()


def save_run(db_path: str | Path, result: RunResult) -> None:
    """Insert or update a run (called as levels finish and when the run ends)."""
    summary = summary_dict(result)
    row = (
        result.run_id, result.started_at, result.status, result.model,
        result.device.get("name", result.device.get("kind", "?")), summary["workload"],
        ",".join(str(u) for u in summary["users"]), ",".join(summary["engines"]),
        json.dumps(summary, default=str), requests_csv_text(result),
    )
    with closing(connect(db_path)) as conn, conn:
        conn.execute("insert or replace into runs values (?,?,?,?,?,?,?,?,?,?)", row)


def list_runs(db_path: str | Path) -> list[dict]:
    """Every stored run, newest first, as a readable table row: when, device, workload, users, output length,
    requests per user, and numbers at the run's top user level (each engine's tok/s and the ratio)."""
    return [run_row(summary) for summary in list_summaries(db_path, limit=None)]


def run_row(s: dict) -> dict:
    """One run as the Results table shows it (engine args stay in the detail view)."""
    top = max(s["users"])
    tok = {engine: found.mean for (engine, users), found in tok_s_spreads(s["runs"]).items() if users == top}
    ratio = s["ratio"].get(str(top))
    load = s.get("load", {})
    return {
        "run_id": s["run_id"], "started": s["started_at"].replace("T", " ")[:16], "status": s["status"],
        "device": s["device"].get("name", ""), "model": s["model"], "workload": s["workload"],
        "users": ",".join(str(u) for u in s["users"]),
        "output len": load.get("output_len") or "workload's",
        "per user": (f"{load['requests_per_user']} req" if load.get("requests_per_user")
                     else f"{load.get('duration_s')} s"),
        "repeats": load.get("repeats", 1),
        "top level": top,
        "HF tok/s": None if tok.get("hf") is None else round(tok["hf"], 1),
        "vLLM tok/s": None if tok.get("vllm") is None else round(tok["vllm"], 1),
        "vLLM/HF": None if ratio is None else round(ratio, 2),
    }


def run_label(row: dict) -> str:
    """A run as the compare dropdown names it."""
    return f"{row['started']} · {row['workload']} · users {row['users']} · {row['status']} ({row['run_id']})"


def _fetch_one(db_path: str | Path, query: str, key: str, missing: str) -> tuple:
    """The one row ``query`` finds for ``key``; KeyError naming what is missing when there is none."""
    with closing(connect(db_path)) as conn:
        row = conn.execute(query, (key,)).fetchone()
    if row is None:
        raise KeyError(f"no such {missing}: no stored {missing} {key!r}")  # a bound parameter: never a path
    return row


def load_summary(db_path: str | Path, run_id: str) -> dict:
    """The stored summary.json of one run."""
    return json.loads(_fetch_one(db_path, "select summary_json from runs where run_id = ?", run_id, "run")[0])


def export_run(db_path: str | Path, run_id: str, out_dir: str | Path) -> dict[str, Path]:
    """Write one stored run's summary.json and requests.csv into out_dir."""
    row = _fetch_one(db_path, "select summary_json, requests_csv from runs where run_id = ?", run_id, "run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(json.loads(row[0]), indent=2))
    (out / "requests.csv").write_text(row[1])
    return {"summary": out / "summary.json", "requests": out / "requests.csv"}


def save_experiment(db_path: str | Path, result) -> None:
    """Insert or update a KV-cache experiment (kind = its name), partial ones too."""
    _save_result(db_path, "experiments", result.experiment_id, result.experiment, result)


def list_experiments(db_path: str | Path, kind: str | None = None) -> list[dict]:
    """Stored experiments, newest first (of one kind if given), as experiment.json dicts."""
    return _list_results(db_path, "experiments", "kind", kind)


def save_sweep(db_path: str | Path, result) -> None:
    """Insert or update a sweep (as each value ends, and at its end; partial ones too)."""
    _save_result(db_path, "sweeps", result.sweep_id, result.plan.knob, result)


def list_sweeps(db_path: str | Path, knob: str | None = None) -> list[dict]:
    """Stored sweeps, newest first (of one knob if given), as sweep.json dicts."""
    return _list_results(db_path, "sweeps", "knob", knob)


def load_sweep(db_path: str | Path, sweep_id: str) -> dict:
    """One stored sweep's sweep.json dict."""
    return json.loads(_fetch_one(db_path, "select result_json from sweeps where sweep_id = ?", sweep_id, "sweep")[0])


def _save_result(db_path: str | Path, table: str, result_id: str, kind: str, result) -> None:
    """One experiment or sweep row: its id, kind, start, status, model, device and its JSON."""
    row = (result_id, kind, result.started_at, result.status, result.model,
           result.device.get("name", result.device.get("kind", "?")), json.dumps(result.to_dict(), default=str))
    with closing(connect(db_path)) as conn, conn:
        conn.execute(f"insert or replace into {table} values (?,?,?,?,?,?,?)", row)


def _list_results(db_path: str | Path, table: str, kind_column: str, kind: str | None) -> list[dict]:
    where = f" where {kind_column} = ?" if kind else ""
    with closing(connect(db_path)) as conn:
        rows = conn.execute(f"select result_json from {table}{where} order by started_at desc",
                            (kind,) if kind else ()).fetchall()
    return [json.loads(text) for (text,) in rows]


def list_summaries(db_path: str | Path, limit: int | None = 200) -> list[dict]:
    """The newest stored runs' summary.json dicts (all of them with limit None)."""
    with closing(connect(db_path)) as conn:
        rows = conn.execute("select summary_json from runs order by started_at desc limit ?",
                            (-1 if limit is None else limit,)).fetchall()
    return [json.loads(text) for (text,) in rows]
