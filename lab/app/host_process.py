"""The engine host in a process of its own, and the dashboard's handle on it (``RemoteHost``).

A page drawn in the interpreter that runs vLLM's async front end takes time from it (on a GPU, up to 5% of its
tok/s: docs/results/h200/README.md), so app.py serves the page from one process and drives the engines from another.
``RemoteHost`` starts ``python -m lab.app.host_process`` in a session of its own (a terminal's Ctrl-C reaches the
app, which closes it), running a LabHost, and offers the page the ``Host`` seam (lab.app.seam). Commands go over a
Unix socket (one connection per calling thread; the host's errors, ValueError included, are raised again in the
page's process). What the page draws is a mirror (lab.app.mirror) that a thread brings up to date every SYNC_S: the
host cuts what is new on its event loop, where nothing changes meanwhile, while a run goes or when its version
moved. The host process stops its engines and leaves when told to close, on SIGTERM, or when the app's pipe to it
closes (the app was killed). If the host process dies, calls raise HostGone, the page says so, and the app kills
what the host left behind (its process group) as it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Listener
from pathlib import Path

from lab import LOG_FORMAT
from lab.app.host import LabHost
from lab.app.mirror import apply, cut, hold
from lab.app.runner import poll_until
from lab.app.seam import ATTRIBUTES, FIXED, MIRRORED, Host, LoadStatus, members
from lab.config import EngineConfig
from lab.engines.registry import default_names
from lab.metrics.machine import ROOT_ENV  # the page's process is the lab's too: its CPU is not another process's
from lab.status import EngineHealth, RunStatus

log = logging.getLogger(__name__)
KEY_ENV = "KVLAB_HOST_KEY"
SYNC_S = 0.25  # how often the page's mirror asks for what is new
LOOP_WAIT_S = 2.0  # a sync that finds the host's loop busy longer than this brings only the header
CONNECT_S = 120.0  # the host process's imports on a slow machine
ANSWER_POLL_S = 0.5  # how often a call waiting for its answer checks that the host process lives
STOP_S = 90.0  # the host process's own close (vLLM's stop) before the app kills it
COMMANDS = members("command") + members("ask")  # what the page may call in the host process
READS = members("read")  # the seam's reads: answers the host computes at each sync
COPIED = tuple(name for name in ATTRIBUTES if name not in FIXED + MIRRORED)  # the attributes every sync copies
SYNCED = COPIED + READS  # what every sync brings, by the seam's declaration


class HostGone(RuntimeError):
    """The engine host process exited or stopped answering."""


@dataclass
class Snapshot:
    """What one sync brings: the seam's SYNCED attributes and reads by name, every time; the tasks' new parts
    while a task goes or when the version moved."""

    values: dict  # SYNCED's names -> their values on the host
    task_kind: str | None = None  # the current task's kind: the page's ``task`` is its mirror of that kind
    parts: bytes | None = None  # pickled {kind: part} (lab.app.mirror.cut), cut on the host's loop
    gone: str = field(default="", repr=False)  # the page's side: why the host process is gone


# -- the host process's side -------------------------------------------------------------------

class HostService:
    """A LabHost and the calls the page may make on it."""

    def __init__(self):
        self.host: LabHost | None = None
        self.connections: list = []  # the listener and the page's sockets: closed in processes forked from this one
        self._closing = threading.Lock()

    def call(self, method: str, args: tuple):
        """One call from the page's process."""
        if method in ("init", "sync", "close", "start_loading"):
            return getattr(self, method)(*args)
        if method not in COMMANDS:
            raise ValueError(f"the engine host has no call {method!r}")
        return getattr(self.host, method)(*args)

    def init(self, config: EngineConfig, engines: tuple, db_path: str | None) -> tuple:
        """Check the config (ValueError before anything loads); the check and the database's path."""
        self.host = LabHost(config, engines, db_path)
        return self.host.check, str(self.host.db_path)

    def start_loading(self) -> None:
        """Start the engines (progress shows in the header)."""
        self.host.start_loading()

    def sync(self, version: int, held: tuple) -> Snapshot:
        """The header, and what the mirror holding ``held`` lacks while a run goes or when the host's version
        moved past ``version``."""
        host = self.host
        try:
            version, running, parts = host.on_loop(lambda: _cut(host, version, held), LOOP_WAIT_S)
        except TimeoutError:  # the loop is busy: the next sync asks again
            running, parts = host.running(), None
        values = {name: getattr(host, name)() if name in READS else getattr(host, name) for name in SYNCED}
        values["version"], values["running"] = version, running  # as of the cut
        return Snapshot(values, None if host.task is None else host.task.KIND, parts)

    def close(self) -> None:
        """Stop the engines (once, whoever asks first: the app, SIGTERM, or the app's pipe closing)."""
        with self._closing:
            if self.host is not None:
                host, self.host = self.host, None
                host.close()

    def forget_connections(self) -> None:
        """In a process forked from the host (vLLM's engine core on CUDA): close its copies of the listener and
        the page's sockets, or a host killed meanwhile would leave the page waiting on sockets that never close
        (and connecting to a listener nobody accepts on)."""
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.close()


def _cut(host: LabHost, version: int, held: tuple) -> tuple:
    """On the host's loop: its version, whether a task goes, and the new parts of the last task of each kind
    pickled (None if nothing moved). Every task's progress bumps the version; a sweep's or an experiment's load
    runs do not, so they are cut at every sync while anything runs."""
    running = host.running()
    if host.version == version and not running:
        return version, running, None
    parts = {kind: cut(thing, held.get(kind)) for kind, thing in host.tasks.items()}
    return host.version, running, pickle.dumps(parts, pickle.HIGHEST_PROTOCOL)


def serve(conn, service: HostService) -> None:
    """Answer one connection's calls in turn until it closes; leave the process after a close."""
    with conn:
        while True:
            try:
                method, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = ("ok", service.call(method, args))
            except Exception as exc:  # noqa: BLE001 - raised again on the page's side
                reply = ("error", exc)
            _send(conn, reply)
            if method == "close":
                _leave(0 if reply[0] == "ok" else 1)


def _send(conn, reply: tuple) -> None:
    """Send a reply; an error that does not pickle goes as a RuntimeError naming it."""
    try:
        conn.send(reply)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        conn.send(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]} ({exc})")))


def _leave(code: int = 0) -> None:
    """Exit at once (no interpreter teardown of torch and its threads)."""
    logging.shutdown()
    os._exit(code)


def _close_and_leave(service: HostService) -> None:
    try:
        service.close()
    except Exception:
        log.exception("stopping the engines failed")
        _leave(1)
    _leave()


def wait_for_eof(fd: int = 0) -> None:
    """Return once the other end of the pipe on ``fd`` has closed. It reads the descriptor itself: a thread
    blocked in sys.stdin's reader holds that reader's lock, and a process forked meanwhile (vLLM's engine
    core on CUDA) hangs for ever closing its copy of sys.stdin (seen on an H100)."""
    while os.read(fd, 4096):
        pass


def _watch_parent(service: HostService) -> None:
    """Stop the engines once the app's end of our stdin closes (the app exited, killed or not)."""
    wait_for_eof()
    if service.host is not None:
        log.info("the app has gone: stopping the engines")
    _close_and_leave(service)


def main(argv: list[str] | None = None) -> None:
    """``python -m lab.app.host_process ADDRESS``: serve a LabHost on a Unix socket (the key comes in KEY_ENV)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    address = (argv or sys.argv[1:])[0]
    service = HostService()
    signal.signal(signal.SIGTERM, lambda *_: _close_and_leave(service))
    os.register_at_fork(after_in_child=service.forget_connections)
    listener = Listener(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    service.connections.append(listener)
    threading.Thread(target=_watch_parent, args=(service,), name="parent-watch", daemon=True).start()
    while True:
        conn = listener.accept()
        service.connections.append(conn)
        threading.Thread(target=serve, args=(conn, service), name="host-call", daemon=True).start()


# -- the page's side ---------------------------------------------------------------------------

class RemoteHost:
    """The ``Host`` seam for the page, with the engines in a process of their own (see the module doc): its
    commands, questions and reads are made from the seam's declarations (``_forward``), not written here."""

    def __init__(self, config: EngineConfig, engines: tuple[str, ...] = default_names(),
                 db_path: str | Path | None = None):
        self.config, self.engine_names, self.version = config, engines, 0
        self.task, self._tasks = None, {}  # the current task's mirror; the mirror of the last of each kind
        self._snap: Snapshot | None = None
        self._settled = False  # whether the mirror's experiment and sweep were cut with no task running
        self._key, self._local, self._sync_lock = secrets.token_bytes(16), threading.local(), threading.Lock()
        self._closed = threading.Event()
        self._dir = tempfile.mkdtemp(prefix="kvlab-host-")
        self._address = os.path.join(self._dir, "host.sock")
        self._process = subprocess.Popen([sys.executable, "-m", "lab.app.host_process", self._address],
                                        stdin=subprocess.PIPE, start_new_session=True,
                                        env={**os.environ, KEY_ENV: self._key.hex(), ROOT_ENV: str(os.getpid())})
        self._pid = self._process.pid
        try:
            self.check, db = self._call("init", config, engines, None if db_path is None else str(db_path))
            self._sync()
        except BaseException:
            self._stop_process()
            raise
        self.db_path = Path(db)
        threading.Thread(target=self._follow, name="host-mirror", daemon=True).start()

    # -- calls ----------------------------------------------------------------------------------
    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def _connect(self):
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                return Client(self._address, family="AF_UNIX", authkey=self._key)
            except (FileNotFoundError, ConnectionRefusedError):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise HostGone(self._gone_words()) from None
                time.sleep(0.05)

    def _call(self, method: str, *args):
        """One call in the host process: its value, its exception raised here, or HostGone."""
        conn = self._connection()
        try:
            conn.send((method, args))
            while not conn.poll(ANSWER_POLL_S):
                if self._process.poll() is not None:  # dead, though a process it forked may hold the socket
                    raise EOFError
            kind, value = conn.recv()
        except (EOFError, OSError) as exc:
            self._local.conn = None
            raise HostGone(self._gone_words()) from exc
        if kind == "error":
            raise value
        return value

    def _command(self, method: str, *args):
        value = self._call(method, *args)
        self._sync()  # what the command started shows at once
        return value

    def _gone_words(self) -> str:
        code = self._process.poll()
        if code is None:
            return "the engine host process does not answer"
        how = f"signal {-code}" if code < 0 else f"code {code}"
        return f"the engine host process exited ({how}): see the app's log, then restart the app"

    # -- the mirror -----------------------------------------------------------------------------
    def _sync(self) -> None:
        """Bring the header and the mirrored tasks up to date."""
        with self._sync_lock:
            held = {kind: hold(thing, self._settled) for kind, thing in self._tasks.items()}
            snap: Snapshot = self._call("sync", self.version, held)
            if snap.parts is not None:
                for kind, part in pickle.loads(snap.parts).items():
                    self._tasks[kind] = apply(self._tasks.get(kind), part)
                self._settled = not snap.values["running"]  # cut with no task running: what it holds is final
            for name in COPIED:
                setattr(self, name, snap.values[name])
            self._snap, self.task = snap, self._tasks.get(snap.task_kind)

    def _follow(self) -> None:
        """Sync every SYNC_S until closed; once the host process is gone, say so in the header."""
        while not self._closed.wait(SYNC_S):
            try:
                self._sync()
            except HostGone as exc:
                if not self._closed.is_set():  # (a sync in flight as the app closes the host is no news)
                    log.error("%s", exc)
                    self._lost(str(exc))
                return
            except Exception:
                log.exception("could not bring the page's copy of the run up to date")

    def _lost(self, why: str) -> None:
        """The header once the host process is gone: not loaded, every engine dead, nothing running."""
        health = {name: {"state": EngineHealth.DEAD, "reason": why, "last_start_s": None}
                  for name in self.engine_names}
        self.status = LoadStatus(total_steps=self.status.total_steps, error=why)
        values = self._snap.values | {"running": False, "status": self.status, "health": health, "dead": [],
                                      "status_text": f"**Engines gone:** {why}.", "agreement": None}
        self._snap = Snapshot(values, self._snap.task_kind, gone=why)

    # -- each side's own -------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until the engines are loaded (or failed, or the host process is gone); True when ready."""
        poll_until(lambda: self.status.ready or bool(self.status.error), timeout_s)
        return self.status.ready

    def last(self, kind: str):
        """The mirror of the host's current (or last) task of ``kind``, None before the first."""
        return self._tasks.get(kind)

    def wait_task(self, timeout_s: float | None = None):
        """Block until the current task has ended and the mirror holds its end (or the timeout passes, or the
        host process is gone); returns the mirror of it (None before the first)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._snap.gone and (deadline is None or time.monotonic() < deadline):
            if not self.running() and (self.task is None or self.task.status != RunStatus.RUNNING):
                break
            time.sleep(SYNC_S / 2)
        return self.task

    def close(self) -> None:
        """Stop the engines and the host process (and what it left behind, if it died)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._call("close")
        except Exception as exc:  # noqa: BLE001 - whatever happened there, the process must go
            log.warning("the engine host did not close cleanly: %s", exc)
        finally:
            self._stop_process()

    def _stop_process(self) -> None:
        self._process.stdin.close()  # a host process that did not get the close leaves on this
        try:
            self._process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            log.error("the engine host process did not stop in %.0f s: killing it", STOP_S)
            self._process.kill()
            self._process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pid, signal.SIGKILL)  # what it started and left (vLLM's engine core, if it died)
        shutil.rmtree(self._dir, ignore_errors=True)


def _forward(name: str, kind: str):
    """RemoteHost's member ``name`` of the seam: a command sent (then a sync), a question asked, or a read of the
    last sync's snapshot."""
    if kind == "read":
        def member(self):
            return self._snap.values[name]
    elif kind == "command":
        def member(self, *args):
            return self._command(name, *args)
    else:
        def member(self, *args):
            return self._call(name, *args)
    member.__name__, member.__doc__ = name, f"The host's {name} ({kind}): {getattr(Host, name).__doc__}"
    return member


for _kind in ("command", "ask", "read"):
    for _name in members(_kind):
        setattr(RemoteHost, _name, _forward(_name, _kind))


if __name__ == "__main__":  # through the package, so that what it pickles is lab.app.host_process's, not __main__'s
    from lab.app.host_process import main as run_host

    run_host()
