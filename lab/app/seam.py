"""What a page may read of the engine host and command it to do: the one seam between the page and the engines.

``Host`` declares it. LabHost (host.py) implements it in the process that drives the engines; RemoteHost
(host_process.py) implements it in the page's process by forwarding exactly what is declared here: each
member's kind says how it crosses.

- attributes: values the page reads (the remote side keeps a mirror of them, synced four times a second);
- ``@command``: changes the host; the remote side sends the call and syncs at once;
- ``@ask``: a question answered by the host when asked;
- ``@read``: an answer as of the last sync (cheap: pages call these every second);
- ``@local``: each side's own (waiting, closing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lab.config import Endpoint, EngineConfig


def _declares(kind: str):
    """A decorator that marks a member of ``Host`` as of ``kind`` (how it crosses to the page's process)."""
    def mark(fn):
        fn.seam = kind
        return fn

    return mark


command, ask, read, local = (_declares(kind) for kind in ("command", "ask", "read", "local"))


@dataclass
class LoadStatus:
    """What is loading and how far it got."""

    steps: list[str] = field(default_factory=list)
    total_steps: int = 0
    ready: bool = False
    error: str = ""
    started_s: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        """One line for the page (while loading it changes every second: the elapsed time)."""
        if self.error:
            return f"Loading failed: {self.error}"
        if self.ready:
            return "Engines ready."
        done = max(0, len(self.steps) - 1)
        current = self.steps[-1] if self.steps else "starting"
        elapsed = time.monotonic() - self.started_s
        return f"Loading ({done}/{self.total_steps} steps done, {elapsed:.0f} s so far): {current}"


class Host(Protocol):
    """The engine host as a page sees it.

    Attributes:
        config: The session's engine config (endpoints included).
        engine_names: The engines loaded (or loading), in order.
        version: Grows whenever there is something new to draw.
        status: Loading progress.
        check: The session check made before loading (model, device, memory plan).
        db_path: The results database.
        task: The current (or last) task of any kind, live while it goes (``last`` gives the last of one kind).
    """

    config: EngineConfig
    engine_names: tuple[str, ...]
    version: int
    status: LoadStatus
    check: Any
    db_path: Path
    task: Any

    @command
    def start_loading(self) -> None:
        """Start the engines; progress goes to ``status``."""

    @command
    def submit(self, plan: Any) -> tuple[bool, str]:
        """Start the task ``plan`` asks for (a RunPlan, ExperimentPlan, SweepPlan or CapacityPlan: lab.tasks)
        unless something is going: (started, message); ValueError on a request its kind refuses."""

    @command
    def cancel(self) -> str:
        """Cancel what is going (it keeps what it measured)."""

    @command
    def connect_endpoint(self, endpoint: Endpoint) -> tuple[bool, str]:
        """Add an OpenAI-compatible server as an engine."""

    @command
    def restart_dead(self) -> tuple[bool, str]:
        """Restart the engines that died."""

    @command
    def open_predictions(self, kind: str) -> tuple[bool, str]:
        """Open the room's predictions for the next load test ('ratio') or Why ladder ('step'): (opened, message)."""

    @command
    def close_predictions(self) -> str:
        """Stop taking predictions (those made go with the next task of their kind)."""

    @command
    def predict(self, page: str, answer: Any) -> tuple[bool, str]:
        """Keep one page's prediction, replacing its last (any page's: attendees predict): (kept, message)."""

    @ask
    def environment(self) -> dict:
        """Device, versions, model, engines and memory, as the Environment tab shows them."""

    @read
    def running(self) -> bool:
        """Whether a task goes."""

    @read
    def health(self) -> dict[str, dict]:
        """Each engine's state, why it is dead, and its last start in s."""

    @read
    def dead(self) -> list[str]:
        """The engines that died and are not being restarted."""

    @read
    def status_text(self) -> str:
        """The header line: loading progress, or each engine's health."""

    @read
    def agreement(self) -> dict | None:
        """The start-up agreement check (None until two engines have loaded)."""

    @read
    def predictions(self) -> dict | None:
        """The room's current round as pages draw it (lab.predictions.Round.view); None before the first."""

    @local
    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until loaded (or failed); True when ready."""

    @local
    def last(self, kind: str) -> Any:
        """The current (or last) task of ``kind`` (run, experiment, sweep, capacity), None before the first: the
        host's own, or the page's mirror of it."""

    @local
    def wait_task(self, timeout_s: float | None = None) -> Any:
        """Block until the current task has ended; returns it (None before the first)."""

    @local
    def close(self) -> None:
        """Stop the engines."""


ATTRIBUTES = tuple(Host.__annotations__)  # the values a page reads: Host's annotations, the one list
FIXED = ("check", "db_path")  # attributes set once, as the host starts: never synced again
MIRRORED = ("task",)  # attributes the page's side mirrors part by part (lab.app.mirror), not copied whole


def members(kind: str) -> tuple[str, ...]:
    """The names of the seam's members of one kind (command, ask, read, local), in declared order."""
    return tuple(name for name, fn in vars(Host).items() if getattr(fn, "seam", None) == kind)


def public(obj) -> set[str]:
    """The public names an object's class offers (what a page could reach)."""
    return {name for name in dir(type(obj)) if not name.startswith("_")} | {
        name for name in vars(obj) if not name.startswith("_")}
