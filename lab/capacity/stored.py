"""The capacity searches the history holds, each as capacity.json reads: the CLI's and the page's (kind capacity),
and those the page stored before the search had one way in, as the experiment ``capacity_search`` (its fields are
capacity.json less what every experiment.json holds). The Capacity and Results tabs list them; a report opens either.
"""

from __future__ import annotations

from lab.store import list_experiments, list_results

OLD_EXPERIMENT = "capacity_search"  # the name the page's searches were stored under before they were kind capacity


def as_capacity(data: dict) -> dict:
    """A stored search as capacity.json reads (an old capacity_search experiment.json gets its id as capacity_id)."""
    return {**data, "capacity_id": data.get("capacity_id", data.get("experiment_id"))}


def stored_searches(db_path) -> list[dict]:
    """Every stored capacity search, newest first, as capacity.json dicts."""
    found = list_results(db_path, "capacity") + [as_capacity(d) for d in list_experiments(db_path, OLD_EXPERIMENT)]
    return sorted(found, key=lambda d: d["started_at"], reverse=True)
