"""Whether each engine can serve, why one died, and when the host stops restarting it.

The host restarts a dead engine before a run that needs it (or on the page's button), unless it died
MAX_DEATHS times in a row with no good run between: then the page says to read the log and restart the app.
"""

from __future__ import annotations

import logging

from lab.engines.registry import label
from lab.status import EngineHealth

log = logging.getLogger(__name__)
MAX_DEATHS = 3  # restarts of one engine in a row (no good run between) before the lab stops restarting it


class EngineDoctor:
    """The engines' health over a host's session; restarts counted per engine since its last good run."""

    def __init__(self, host):
        self.host = host
        self.deaths: dict[str, int] = {}
        self.restarting: set[str] = set()
        self.errors: dict[str, str] = {}

    def health(self) -> dict[str, dict]:
        """Each engine: state (loading, alive, dead, restarting), why it is dead, and its last start in s."""
        session, status = self.host.session, self.host.status
        engines = session.engines if session else {}
        starts = session.start_s if session else {}
        out = {}
        for name in self.host.engine_names:
            engine, reason = engines.get(name), self.errors.get(name, "")
            if name in self.restarting:
                state = EngineHealth.RESTARTING
            elif engine is None:
                state = EngineHealth.DEAD if (status.error or reason) else EngineHealth.LOADING
                reason = reason or status.error
            else:
                state = EngineHealth.ALIVE if engine.alive() else EngineHealth.DEAD
                reason = "" if state == EngineHealth.ALIVE else engine.fault() or "stopped"
            out[name] = {"state": state, "reason": reason, "last_start_s": starts.get(name),
                         "probe": session.probes.get(name) if session else None}  # lab.estimate's start probe
        return out

    def dead(self, health: dict[str, dict] | None = None) -> list[str]:
        """The engines that died (and are not being restarted); ``health`` when it was just read."""
        if self.host.session is None:  # nothing loaded (or loading failed): nothing to restart
            return []
        return [name for name, h in (health or self.health()).items() if h["state"] == EngineHealth.DEAD]

    def refuse(self, names: list[str]) -> str | None:
        """Why the lab will not restart these engines again (each died MAX_DEATHS times in a row), else None."""
        worn = [name for name in names if self.deaths.get(name, 0) >= MAX_DEATHS]
        if not worn:
            return None
        return (f"{', '.join(map(label, worn))} died {MAX_DEATHS} times in a row, each time after a restart: the "
                f"lab stops restarting it. Read the app's log for the cause, then restart the app.")

    def recovered(self, names) -> None:
        """A good run: these engines' streaks of deaths end."""
        for name in names:
            self.deaths.pop(name, None)

    def start_words(self, names: list[str]) -> str:
        """How long these engines' last starts took, for the page while they restart."""
        starts = self.host.session.start_s if self.host.session else {}
        took = [f"{label(name)} took {starts[name]:.0f} s" for name in names if name in starts]
        return "its last start " + ", ".join(took) if took else "first start"

    def restart(self, names: list[str]):
        """Mark ``names`` restarting now, as their task starts (a page never sees the task going with no engine
        restarting, and so a Cancel to press); then the coroutine that restarts them."""
        self.restarting.update(names)
        return self._restart(names)

    async def _restart(self, names: list[str]) -> bool:
        """Restart each engine with its own settings; True when all came back."""
        session, ok = self.host.session, True
        for name in names:
            self.deaths[name] = self.deaths.get(name, 0) + 1
            self.errors.pop(name, None)
            self.host.bump()
            try:
                await session.restart_engine(name, session.configs.get(name, self.host.config))
                log.info("%s restarted in %.1f s", name, session.start_s[name])
            except Exception as exc:
                log.exception("restarting %s failed", name)
                self.errors[name] = f"restarting {name} failed: {type(exc).__name__}: {exc}"
                ok = False
            finally:
                self.restarting.discard(name)
                self.host.bump()
        return ok

    def status_text(self, health: dict[str, dict] | None = None) -> str:
        """The header line: loading progress, or each engine's health once loaded (``health`` when just read); what
        to press lies beside the page's Restart button, the presenter's."""
        status = self.host.status
        if not status.ready:
            return status.text()
        health = self.health() if health is None else health
        if all(h["state"] == EngineHealth.ALIVE for h in health.values()):
            return "Engines ready."
        dead = self.dead(health)
        refused = self.refuse(dead)
        return "Engines: " + "; ".join(self._words(name, h) for name, h in health.items()) + "." + (
            f" {refused}" if refused else "")

    def _words(self, name: str, health: dict) -> str:
        if health["state"] == EngineHealth.DEAD:
            return f"**{label(name)} dead**: {health['reason']}"
        if health["state"] == EngineHealth.RESTARTING:
            return f"**{label(name)} restarting** ({self.start_words([name])})"
        return f"{label(name)} {health['state']}"
