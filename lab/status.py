"""Statuses, defined once: how a request ended, and how a level or a run ended.

Both are str enums, so they compare equal to, and serialise as, the plain words ('ok', 'cancelled')
that summary.json, requests.csv and the results database hold.
"""

from __future__ import annotations

from enum import StrEnum


class RequestStatus(StrEnum):
    """How one request ended."""

    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    """How a level or a run ended (RUNNING while it goes)."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"


class EngineHealth(StrEnum):
    """Whether an engine can serve: what the page header, the Environment tab and the host go by."""

    LOADING = "loading"
    ALIVE = "alive"
    DEAD = "dead"
    RESTARTING = "restarting"
