"""Little's law, re-read from a stored capacity search's requests under the lab's current rule.

A capacity search writes every probe's requests (DIR/requests.csv, or .csv.gz) beside capacity.json; the
steady-window rule (lab.capacity.littles_law) can change after a search ran, as it did for the H200 searches in
docs/capacity.md. This prints, per probe, the check as the current code computes it and the caption's line, so a
table in the docs comes from a command, not from hand:

    .venv/bin/python -m bench.capacity_little docs/results/h200-capacity/8b
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path
from types import SimpleNamespace

from lab.capacity import littles_law
from lab.capacity.words import little_line


def read_rows(folder: Path) -> list[dict]:
    """requests.csv's rows (plain or gzipped)."""
    plain = folder / "requests.csv"
    opened = plain.open() if plain.exists() else gzip.open(folder / "requests.csv.gz", "rt")
    with opened as handle:
        return list(csv.DictReader(handle))


def record(row: dict) -> SimpleNamespace:
    """The fields Little's law reads, as numbers (empty cells: None)."""
    def number(key: str) -> float | None:
        return float(row[key]) if row.get(key) not in (None, "") else None
    return SimpleNamespace(send_s=number("send_s"), end_s=number("end_s"), scheduled_s=number("scheduled_s"),
                           user_id=int(row["user_id"]) if row.get("user_id") else None, status=row["status"])


def reread(folder: Path) -> dict:
    """capacity.json with every probe's ``little`` recomputed from its requests."""
    data = json.loads((folder / "capacity.json").read_text())
    by_probe: dict[int, list] = {}
    for row in read_rows(folder):
        by_probe.setdefault(int(row["probe"]), []).append(record(row))
    for index, probe in enumerate(data["probes"]):
        users = None if probe.get("rate") else probe["users"]
        probe["little"] = littles_law(by_probe.get(index, []), users, probe.get("rate"))
    return data


def probe_text(probe: dict) -> str:
    """One probe's line: window, L measured and computed, agreement, the edge bound, steady and agreed."""
    little = probe["little"]
    if little.get("agreement") is None:
        return f"{probe['engine']:>5} {probe['level']:>6g} {probe['repeat']}  no window: {little.get('why')}"
    return (f"{probe['engine']:>5} {probe['level']:>6g} {probe['repeat']}  window {little['window_s']:7.2f} s  "
            f"L {little['mean_in_system']:7.2f}  computed {little['computed_in_system']:7.2f}  "
            f"agreement {little['agreement']:.3f}  bound {little.get('edge_bound', float('nan')):.3f}  "
            f"steady {little['steady']}  agreed {little['agreed']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="capacity output folders (capacity.json + requests)")
    for folder in parser.parse_args(argv).folders:
        data = reread(folder)
        print(f"== {folder}")
        print("\n".join(probe_text(p) for p in data["probes"]))
        print(little_line(data))


if __name__ == "__main__":
    main()
