"""``python -m lab report DIR_OR_ID --out report.html``: a stored result as one HTML file to hand out.

A run, an experiment (the why ladder is one), a sweep or a capacity search. A folder is read as the CLI wrote it
(``FOLDER_FILES``: bench's summary.json and requests.csv, experiment's experiment.json, explain's explain.json,
sweep's sweep.json, capacity's capacity.json); anything else is an id in the lab's database, of any kind.
lab.plots.report draws the page its kind has (lab.report.html its tables and prose).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from lab.store import default_db_path, list_stored, load_result

FOLDER_FILES = {"summary.json": "run", "experiment.json": "experiment", "explain.json": "experiment",
                "sweep.json": "sweep", "capacity.json": "capacity"}  # the file a CLI command writes -> its kind


def result_files(source: str, db_path: str | Path | None = None) -> tuple[str, dict, pd.DataFrame]:
    """The kind, the JSON and (a run's) requests of a folder the CLI wrote or of a stored result's id (KeyError
    names a missing id)."""
    folder = Path(source)
    found = next((name for name in FOLDER_FILES if (folder / name).is_file()), None)
    if found is not None:
        data = json.loads((folder / found).read_text())
        return FOLDER_FILES[found], data, read_requests(folder / "requests.csv")
    kind, data, csv_text = load_result(db_path or default_db_path(), source)
    return kind, data, pd.read_csv(io.StringIO(csv_text)) if csv_text else pd.DataFrame()


def read_requests(path: Path) -> pd.DataFrame:
    """requests.csv, or an empty table where the run wrote none."""
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()


def write_report(source: str, out: str | Path, db_path: str | Path | None = None) -> Path:
    """Write the report of a run, experiment, sweep or capacity search to ``out``; returns its path."""
    from lab.plots.report import report_page

    kind, data, requests = result_files(source, db_path)
    text = report_page(kind, data, requests)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def stored_lines(db_path: str | Path | None = None) -> list[str]:
    """One line per stored result, newest first: its id, kind, name, start and status (``report --list``)."""
    return [f"{r['id']}  {r['kind']:<10} {r['name']:<18} {r['started_at'].replace('T', ' ')[:16]}  {r['status']}"
            for r in list_stored(db_path or default_db_path())]
