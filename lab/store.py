"""Past runs, experiments and sweeps in one SQLite table: saved as they go (partial ones too), listed, compared,
exported.

Every stored run keeps exactly the files the CLI writes (summary.json and requests.csv), so a run
downloaded from the browser is the same as one written by ``python -m lab bench``.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from lab.engines import registry
from lab.metrics import ratios_by_users, tok_s_spreads
from lab.model import cache_dir
from lab.runs import RunResult, requests_csv_text
from lab.tasks import TaskResult

log = logging.getLogger(__name__)

SCHEMA = """
create table if not exists results (
    id text primary key,
    kind text not null,
    name text not null,
    started_at text not null,
    status text not null,
    model text not null,
    device text not null,
    result_json text not null,
    requests_csv text
)
"""
# the three tables stores had before one held every kind: (table, its id, kind, where its name comes from)
OLD_TABLES = (("runs", "run_id", "run", "workload", "summary_json", "requests_csv"),
              ("experiments", "experiment_id", "experiment", "kind", "result_json", "null"),
              ("sweeps", "sweep_id", "sweep", "knob", "result_json", "null"))


def default_db_path() -> Path:
    """$KVLAB_CACHE/results.sqlite."""
    return cache_dir() / "results.sqlite"


def connect(db_path: str | Path) -> sqlite3.Connection:
    """Open (and create if needed) the results database; an older one's tables move into ``results``."""
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path, timeout=10)
    conn.execute(SCHEMA)
    _move_old_tables(conn)
    return conn


def _move_old_tables(conn: sqlite3.Connection) -> None:
    """Copy each older per-kind table's rows into ``results``, then drop it (one transaction per table)."""
    present = {name for (name,) in conn.execute("select name from sqlite_master where type = 'table'")}
    for table, key, kind, name, body, requests in OLD_TABLES:
        if table in present:
            with conn:
                conn.execute(f"insert or ignore into results select {key}, '{kind}', {name}, started_at, status, "
                             f"model, device, {body}, {requests} from {table}")
                conn.execute(f"drop table {table}")


def save(db_path: str | Path, result: TaskResult, extra: dict | None = None) -> None:
    """Insert or update a run, experiment, sweep or capacity search (partial or final): its JSON (with ``extra``'s
    keys, e.g. the room's ``predictions``), and a run's requests.csv."""
    data = result.to_dict() | (extra or {})
    row = (result.id, result.KIND, result.name(), result.started_at, result.status, result.model,
           result.device.get("name", result.device.get("kind", "?")), json.dumps(data, default=str),
           requests_csv_text(result) if isinstance(result, RunResult) else None)
    with closing(connect(db_path)) as conn, conn:
        conn.execute("insert or replace into results values (?,?,?,?,?,?,?,?,?)", row)


def keep(db_path: str | Path, result: TaskResult, extra: dict | None = None) -> None:
    """``save``, a failure logged and never raised: a task is never failed by its history."""
    try:
        save(db_path, result, extra)
    except Exception:
        log.exception("could not store %s %s", result.KIND, result.id)


def save_at_checkpoint(result: TaskResult, stored: object, store: Callable[[TaskResult], None]) -> object:
    """The one rule of when a task goes to the history: ``store(result)`` when its checkpoint has moved from
    ``stored`` (the one it was last stored at); returns the checkpoint it is stored at now."""
    mark = result.checkpoint()
    if mark is None or mark == stored:
        return stored
    store(result)
    return mark


LEAD_COLUMNS = ("when", "engines", "users", "workload", "top level")  # then each engine's tok/s, the ratio, status
DETAIL_COLUMNS = ("run_id", "when", "status", "device", "model", "output len", "per user", "repeats", "rate",
                  "estimated s", "took s", "estimate error")


def list_runs(db_path: str | Path) -> list[dict]:
    """Every stored run, newest first, as a readable table row (run_row)."""
    return [run_row(summary) for summary in list_summaries(db_path, limit=None)]


def run_row(s: dict) -> dict:
    """One run as the Results table shows it: when, engines, users, workload, then each engine's tok/s and the
    ratio at the top user level it measured (a cancelled run's last measured level), its status, and the details
    (id, device, model, lengths, the estimate it was given and its measured time). Engine args stay in the
    compare view."""
    top, rows = top_level(s)
    tok = {engine: found.mean for (engine, users), found in tok_s_spreads(rows).items() if users == top}
    ratio = ratios_by_users(rows).get(top)
    load = s.get("load", {})
    row = {
        "run_id": s["run_id"], "when": s["started_at"].replace("T", " ")[:16], "engines": ",".join(s["engines"]),
        "users": ",".join(str(u) for u in s["users"]), "workload": workload_words(s), "top level": top,
        **{f"{registry.label(engine)} tok/s": _round(tok.get(engine), 1) for engine in s["engines"]},
        "vLLM/HF": _round(ratio, 2), "status": s["status"],
        "device": s["device"].get("name", ""), "model": s["model"],
        "output len": load.get("output_len") or "workload's",
        "per user": (f"{load['requests_per_user']} req" if load.get("requests_per_user")
                     else f"{load.get('duration_s')} s"),
        "repeats": load.get("repeats", 1), "rate": load.get("rate") or "closed loop",
    }
    return row | estimate_columns(s)


def top_level(s: dict) -> tuple[int, list[dict]]:
    """The top user level a run measured (a cancelled run's last measured level; the plan's top when none) and the
    measured rows: where the Results table and the room's predictions read a run's headline."""
    rows = measured_rows(s["runs"])
    return max((row["users"] for row in rows), default=max(s["users"])), rows


def measured_rows(runs: list[dict]) -> list[dict]:
    """The levels that finished (a cancelled or failed run: those, else the levels that finished a request)."""
    return [r for r in runs if r.get("status", "ok") == "ok"] or [r for r in runs if r.get("completed")]


def workload_words(s: dict) -> str:
    """'mixed, 2 req/user, out 8': the workload and what bounds a level."""
    load = s.get("load", {})
    bound = f"{load['requests_per_user']} req/user" if load.get("requests_per_user") else f"{load.get('duration_s')} s"
    return ", ".join([s["workload"], bound] + ([f"out {load['output_len']}"] if load.get("output_len") else []))


def estimate_columns(s: dict) -> dict:
    """The estimate the run was given, its measured time from Run to its end, and the error (computed)."""
    estimate, took = s.get("estimate_s"), s.get("wall_s")
    error = f"{100 * (estimate - took) / took:+.0f}%" if estimate and took else None
    return {"estimated s": _round(estimate, 1), "took s": _round(took, 1), "estimate error": error}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run_label(row: dict) -> str:
    """A run as the compare dropdown names it."""
    return f"{row['when']} · {row['workload']} · users {row['users']} · {row['status']} ({row['run_id']})"


def _fetch_one(db_path: str | Path, kind: str, key: str, column: str = "result_json") -> tuple:
    """The stored ``column`` of the ``kind`` called ``key``; KeyError naming what is missing when there is none."""
    with closing(connect(db_path)) as conn:
        row = conn.execute(f"select {column} from results where kind = ? and id = ?", (kind, key)).fetchone()
    if row is None:
        raise KeyError(f"no such {kind}: no stored {kind} {key!r}")  # a bound parameter: never a path
    return row


def load_result(db_path: str | Path, result_id: str) -> tuple[str, dict, str | None]:
    """The kind, the JSON and (a run's) requests.csv text of the result stored as ``result_id``, whatever its kind;
    KeyError naming the id when there is none."""
    with closing(connect(db_path)) as conn:
        row = conn.execute("select kind, result_json, requests_csv from results where id = ?",
                           (result_id,)).fetchone()
    if row is None:
        # the id is bound as a parameter, never a path
        raise KeyError(f"no such run, experiment, sweep or capacity search: nothing stored as {result_id!r}")
    return row[0], json.loads(row[1]), row[2]


def list_stored(db_path: str | Path) -> list[dict]:
    """Every stored result, newest first: its id, kind, name, start and status (no JSON)."""
    with closing(connect(db_path)) as conn:
        rows = conn.execute("select id, kind, name, started_at, status from results order by started_at desc")
        return [dict(zip(("id", "kind", "name", "started_at", "status"), row, strict=True)) for row in rows]


def load_summary(db_path: str | Path, run_id: str) -> dict:
    """The stored summary.json of one run."""
    return json.loads(_fetch_one(db_path, "run", run_id)[0])


def export_run(db_path: str | Path, run_id: str, out_dir: str | Path) -> dict[str, Path]:
    """Write one stored run's summary.json and requests.csv into out_dir."""
    row = _fetch_one(db_path, "run", run_id, "result_json, requests_csv")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(json.loads(row[0]), indent=2))
    (out / "requests.csv").write_text(row[1])
    return {"summary": out / "summary.json", "requests": out / "requests.csv"}


def list_experiments(db_path: str | Path, name: str | None = None) -> list[dict]:
    """Stored experiments, newest first (of one name if given), as experiment.json dicts."""
    return list_results(db_path, "experiment", name)


def list_sweeps(db_path: str | Path, knob: str | None = None) -> list[dict]:
    """Stored sweeps, newest first (of one knob if given), as sweep.json dicts."""
    return list_results(db_path, "sweep", knob)


def load_sweep(db_path: str | Path, sweep_id: str) -> dict:
    """One stored sweep's sweep.json dict."""
    return json.loads(_fetch_one(db_path, "sweep", sweep_id)[0])


def list_results(db_path: str | Path, kind: str, name: str | None = None, limit: int | None = None) -> list[dict]:
    """Stored results of one kind, newest first (of one name if given), as their JSON dicts."""
    where = " and name = ?" if name else ""
    with closing(connect(db_path)) as conn:
        rows = conn.execute(f"select result_json from results where kind = ?{where} order by started_at desc "
                            f"limit ?", (kind, *((name,) if name else ()), -1 if limit is None else limit)).fetchall()
    return [json.loads(text) for (text,) in rows]


def list_summaries(db_path: str | Path, limit: int | None = 200) -> list[dict]:
    """The newest stored runs' summary.json dicts (all of them with limit None)."""
    return list_results(db_path, "run", limit=limit)
