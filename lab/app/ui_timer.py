"""The one wiring every tab uses: a gr.Timer writes change keys into gr.State, and redraws hang off them; and a
task tab's Run, Cancel, message and progress lines.

As in trackio: every tick reads a cheap key per group of components (a status string, an id and a count);
a group is redrawn only when its own key changed (the State's change event), so a quiet page costs a few
attribute reads a second and no figures. A room of pages costs one build per change, not one per page: each
group's redraw is ``Shared``, built once per value of its key (figures already turned into their JSON) and
handed to every page that asks while the key holds; while a run goes its key moves several times a second, so
a build is at most REBUILD_S old before the next (the tick reads the key of what would be served, and the redraw is
told the key the tick read and hands out no build older than it, so a page never keeps a stale build: the newer
one comes at its next tick). Every tab adds its groups to one ``Ticker``: a page sends one tick a second whatever
the number of tabs. Each tick is a queued event, the server's cost per page; a room's
``Pace`` slows every page alike once the room would tick more often than the server's cores serve cheaply (up to
5 s a tick: past 25 pages per core the room's ticks grow again, five times slower than with no pace). A page's
first frame carries the same groups (lab.app.ui_frame), and its first tick redraws every group once, so that the
page's session on the server holds what its first frame showed.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

import gradio as gr
from gradio.components.plot import PlotData

from lab.app.access import CANCEL, START
from lab.app.ui_access import Guard

Group = tuple  # (key, redraw, the components redraw returns[, the components redraw reads]): a group that reads
#               components (an empty list: only the page's request) is the page's own, not shared
ANY = object()  # what a page's first frame promises a shared redraw: any build will do (Shared.__call__)
UNSEEN = "unseen"  # a page's keys before its first tick: no key equals it, so the first tick redraws every group
REBUILD_S = 0.9  # a shared build serves newer keys for this long, just under the page's 1-s tick: a room's pages,
#                  ticking out of phase, build about once a second, as one page does, and one page still gets
#                  every tick's change


ROOM_TICKS_PER_CORE_S = 5  # the ticks a second a room's pages may send, per CPU core of the server: a tick served
#   costs the page process ~7.6 ms on a 2-core EPYC (docs/results/cpu-viewers.md), so 5 a second is ~4% of a core
SLOWEST_TICK_S = 5.0  # however full the room, a page asks at least this often


class Ticker:
    """The page's one timer: tabs add their groups while the layout is built; ``wire`` (at the end) wires them."""

    def __init__(self, tick_s: float, quiet: dict, pace: Pace | None = None):
        self.tick_s, self.quiet = tick_s, quiet
        self.pace = pace or Pace.for_server(tick_s)
        self.groups: list[Group] = []

    def add(self, groups: Sequence[Group]) -> None:
        self.groups += groups

    def shared(self) -> list[Group]:
        """The groups every page shares (the ones a page's first frame can carry)."""
        return [group for group in self.groups if len(group) == 3]

    def wire(self) -> None:
        redraw_on_change(self.groups, self.tick_s, self.quiet, self.pace)


def redraw_on_change(groups: Sequence[Group], tick_s: float, quiet: dict, pace: Pace) -> None:
    """Wire one timer for ``groups`` (call inside the Blocks); each tick reads the page's interval and may set it."""
    keys = [gr.State(UNSEEN) for _ in groups]
    shown = [redraw if inputs else Shared(key, redraw) for key, redraw, _, *inputs in groups]  # one that reads
    #        the page's own values is the page's own
    read = [getattr(fn, "key_now", group[0]) for fn, group in zip(shown, groups, strict=True)]
    timer = gr.Timer(tick_s)

    def tick(interval: float, request: gr.Request) -> list:
        return [key() for key in read] + [pace.ticked(request.session_hash, interval)]

    # queued: only a queued event reports which States it changed, and so fires their change events
    timer.tick(tick, timer, keys + [timer], **quiet)
    for state, fn, (_, _, outputs, *inputs) in zip(keys, shown, groups, strict=True):  # a shared redraw is told
        #                                                       the key the page's tick read (Shared.__call__)
        state.change(fn, inputs[0] if inputs else [state], outputs, queue=False, **quiet)


class Pace:
    """How often the room's pages tick: every ``tick_s`` while the pages that ticked lately stay within ``budget``
    ticks a second; past it every page waits the same whole number of seconds, enough to keep the room within the
    budget, up to SLOWEST_TICK_S. So the room's ticks a second stay within the budget up to SLOWEST_TICK_S x budget
    pages (50 on 2 cores), and grow by one every SLOWEST_TICK_S for each page past that. A page for which ``steady``
    holds (the presenter's) counts in the room but keeps ``tick_s``. Pages are trusted to keep the pace they are
    told, as a browser does."""

    def __init__(self, tick_s: float, budget: float, steady: Callable[[str | None], bool] = lambda session: False):
        self.tick_s, self.budget, self.steady = tick_s, budget, steady
        self._lock = threading.Lock()
        self._seen: dict[str | None, float] = {}  # session: when it last ticked

    @classmethod
    def for_server(cls, tick_s: float, steady: Callable[[str | None], bool] = lambda session: False) -> Pace:
        """The pace of this server: ROOM_TICKS_PER_CORE_S for each of its cores."""
        return cls(tick_s, ROOM_TICKS_PER_CORE_S * server_cores(), steady)

    def interval(self, pages: int) -> float:
        """Seconds between a page's ticks in a room of ``pages`` (within the budget: pages / interval <= budget)."""
        return min(SLOWEST_TICK_S, max(self.tick_s, float(math.ceil(pages / self.budget))))

    def ticked(self, session: str | None, has: float) -> dict | gr.Timer:
        """Note a page's tick (its timer's interval is ``has``): a gr.Timer update with the interval it should
        have, or a skip where it has it. A page that has not ticked for two of the slowest intervals has left."""
        now = time.monotonic()
        with self._lock:
            self._seen = {s: at for s, at in self._seen.items() if now - at < 2 * SLOWEST_TICK_S} | {session: now}
            interval = self.tick_s if self.steady(session) else self.interval(len(self._seen))
        return gr.skip() if interval == has else gr.Timer(interval)


def server_cores() -> float:
    """The CPU cores this process may use: its affinity, or its container's CPU quota where that is lower (a
    container limited by a quota, not pinned, sees every core of its host in its affinity)."""
    cores = float(len(os.sched_getaffinity(0)))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        cores = min(cores, int(quota) / int(period)) if quota != "max" else cores
    return cores


class Shared:
    """A redraw built once per value of its key and shared by every page (thread-safe: a page that asks while
    another builds waits for that build)."""

    def __init__(self, key: Callable, redraw: Callable, rebuild_s: float = REBUILD_S):
        self.key, self.redraw, self.rebuild_s = key, redraw, rebuild_s
        self.__name__ = getattr(redraw, "__name__", "redraw")
        self._lock = threading.Lock()
        self._built: tuple | None = None  # (key, outputs, when)

    def key_now(self):
        """The key a tick should see: the host's, unless the last build is younger than ``rebuild_s`` (then that
        build's key: the newer state is drawn at a later tick)."""
        key, built = self.key(), self._built
        if built is None or built[0] == key or time.monotonic() - built[2] >= self.rebuild_s:
            return key
        return built[0]

    def __call__(self, promised=ANY):
        """The outputs of the last build, or of a new one at the current key. A build at an older key is handed
        out only while it is younger than ``rebuild_s`` and is the build at ``promised``, the key the page's tick
        read and its State now holds (a first frame promises nothing): a page handed an older build than its key
        would keep it, since its later ticks read that key again."""
        key = self.key()
        with self._lock:
            built = self._built
            if built is None or (built[0] != key and not self._serves(built, promised)):
                self._built = built = (key, prepared(self.redraw()), time.monotonic())
            return handed_out(built[1])

    def _serves(self, built: tuple, promised) -> bool:
        """Whether ``built``, not at the host's key, may still be handed to a page that holds ``promised``."""
        return time.monotonic() - built[2] < self.rebuild_s and (promised is ANY or promised == built[0])


def prepared(outputs):
    """Outputs with every Plotly figure turned into the JSON a page gets (once, not once per page)."""
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(prepared(value) for value in outputs)
    if type(outputs).__module__.startswith("plotly"):
        return PlotData(type="plotly", plot=outputs.to_json())
    return outputs


def handed_out(outputs):
    """A copy of the outputs' update dicts (Gradio pops their value as it sends one to a page)."""
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(handed_out(value) for value in outputs)
    return dict(outputs) if isinstance(outputs, dict) else outputs


def start_task(host, make_plan: Callable) -> str:
    """Submit the request ``make_plan()`` builds (a plan of any task kind; it, or the host's check, raises ValueError
    on bad input); the tab's message line, in the same words on every tab: the input error, the refusal, or the
    start."""
    try:
        started, message = host.submit(make_plan())
    except ValueError as exc:
        return f"**Input error:** {exc}"
    return message if started else f"**Not started:** {message}"


def skipped(named: type, **given) -> object:
    """A named group (a dataclass of a tab's parts) with ``given`` members and the rest left as they are
    (gr.skip())."""
    return named(**{f.name: given.get(f.name, gr.skip()) for f in fields(named)})


def current_experiment(host, name: str):
    """The host's experiment when it is a ``name`` one, else None (what a tab of that experiment draws)."""
    result = host.last("experiment")
    return result if result is not None and result.experiment == name else None


def run_cancel_lines(prefix: str, idle: str, guard: Guard) -> tuple:
    """A task tab's Run and Cancel (put under ``guard``'s rule: an attendee's page shows them disabled, with the
    note under them), its message line and its progress line (``idle`` until a task of its kind exists); element
    ids PREFIX-run, -cancel, -watch, -message, -progress."""
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id=f"{prefix}-run", interactive=False)
        cancel = gr.Button("Cancel", variant="stop", elem_id=f"{prefix}-cancel", interactive=False)
    guard.gate(START, run)
    guard.gate(CANCEL, cancel)
    guard.note("Run and Cancel", f"{prefix}-watch")
    return run, cancel, gr.Markdown(elem_id=f"{prefix}-message"), gr.Markdown(idle, elem_id=f"{prefix}-progress")
