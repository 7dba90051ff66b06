"""``python -m lab report RUN_DIR_OR_ID --out report.html``: a stored run as one HTML file to hand out.

A folder is read as ``lab bench`` wrote it (summary.json, requests.csv); anything else is a run id in the lab's
database (the Results tab's runs). lab.plots_report draws the page.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from lab.store import default_db_path, export_run


def run_files(source: str, db_path: str | Path | None = None) -> tuple[dict, pd.DataFrame]:
    """summary.json and requests.csv of a run folder, or of a stored run's id (KeyError names a missing id)."""
    folder = Path(source)
    if not (folder / "summary.json").is_file():
        folder = Path(tempfile.mkdtemp(prefix="kvlab-report-"))
        export_run(db_path or default_db_path(), source, folder)
    return json.loads((folder / "summary.json").read_text()), read_requests(folder / "requests.csv")


def read_requests(path: Path) -> pd.DataFrame:
    """requests.csv, or an empty table where the run wrote none."""
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()


def write_report(source: str, out: str | Path, db_path: str | Path | None = None) -> Path:
    """Write the run's report to ``out``; returns its path."""
    from lab.plots_report import report_html

    summary, requests = run_files(source, db_path)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(summary, requests), encoding="utf-8")
    return path
