"""What do watching pages cost the server? N viewers simulated at the protocol level beside a short real run.

Starts app.py on 127.0.0.1 (the engines and engine options given) and, for each viewer count, a viewer process
pinned to the last CPU (or --viewer-cpus of them on the last CPUs, the sessions shared out) that holds N page
sessions and does what each page's JavaScript does, with no browser: every second (or as often as the tick's answer
sets the page's timer: lab.app.ui_timer.Pace) it joins each gr.Timer's tick (queued: POST /gradio_api/queue/join,
answered on the session's stream /gradio_api/queue/data) and, for every
State the tick changed, calls that State's change events (POST /gradio_api/run/predict): the redraws, figures
included. Once the viewers watch, the bench runs the plan through /run_and_wait (each level --repeats times) and
meters, over the run, the CPU seconds of the app's page process (what viewers cost) and of its engine host process
with vLLM's processes (what the run costs), per minute of wall time. While the run goes it opens --new-pages fresh
sessions, one after another, and times each one's status line: from GET / to the answer of the event that first
draws it (an unqueued load event; or the queued loads, the first tick and the redraw). Prints one row per viewer
count and whether the top count's tok/s lies in the lowest count's repeat spread. With --predict each count runs
twice, the second time with the room's predictions: the bench opens them as the presenter (/open_predictions) and
every simulated page sends one before the run (as its Predict button does), so the run takes them along and every
page draws the room against the measured ratio at its end; the verdict then sets each count's tok/s with
predictions against its spread without.

Usage: python -m bench.viewers [--viewers 1,10,50] [--engines hf,vllm] [--users 1,4] [--output-len 32]
       [--requests-per-user 2] [--repeats 3] [--watch-s 8] [--viewer-cpus 1] [--predict] [--out DIR] [engine options]
       python -m bench.viewers --simulate URL --sessions N --report FILE [--predict]   (the viewer process itself)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.dashboard_overhead import cpu_seconds, host_pid, serving_app
from lab.metrics import tok_s_spreads
from lab.options import add_engine_args

TICK_S = 1.0  # the page's gr.Timer (lab.app.ui.TICK_S)
STATUS_ID = "load-status"  # the header's status line


# -- the viewer process: N sessions at the protocol level --------------------------------------------
class AppShape:
    """What a page's JavaScript reads from /config: the timers' tick events, each State's change events, the
    load events, the status line's redraw, and each component's value as first drawn (what an event sends of its
    inputs: a page that nobody edits)."""

    def __init__(self, config: dict):
        deps = config["dependencies"]
        self.prefix = config.get("api_prefix", "/gradio_api")
        self.ticks = [d for d in deps if d["backend_fn"] and any(e == "tick" for _, e in d["targets"])]
        self.timers = {t for d in self.ticks for t, _ in d["targets"]}  # a tick sends its timer's interval
        self.timer_at = {d["id"]: d["outputs"].index(t) for d in self.ticks for t, _ in d["targets"]
                         if t in d["outputs"]}  # a tick that sets its own timer's interval: where in its answer
        loads = [d for d in deps if d["backend_fn"] and any(e == "load" for _, e in d["targets"])]
        self.loads = [d for d in loads if d.get("queue") is not False]
        self.direct_loads = [d for d in loads if d.get("queue") is False]  # answered at once, outside the queue
        self.changes: dict[int, list[dict]] = {}
        for d in deps:
            for target, event in d["targets"]:
                if event == "change" and d["backend_fn"]:
                    self.changes.setdefault(target, []).append(d)
        self.values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}  # as first drawn
        self.predict = next((d for d in deps if d.get("api_name") == "predict"), None)  # the Predict button's event
        status = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == STATUS_ID)
        drawing = [d for d in self.direct_loads + self.ticks + [d for ds in self.changes.values() for d in ds]
                   if status in d["outputs"]]
        self.status_fn, self.status_at = drawing[0]["id"], drawing[0]["outputs"].index(status)  # the first to draw it


class Session:
    """One page: its session hash, and its calls."""

    def __init__(self, http, url: str, shape: AppShape, stats: dict):
        self.http, self.url, self.shape, self.stats = http, url.rstrip("/"), shape, stats
        self.hash = secrets.token_hex(6)
        self.interval = TICK_S  # as the page's timer has it

    def body(self, dep: dict, trigger: int | None, typed: dict | None = None) -> dict:
        """An event's request: each input as first drawn, the timer's interval, or what the page ``typed``."""
        typed = typed or {}
        data = [self.interval if i in self.shape.timers else typed.get(i, self.shape.values.get(i))
                for i in dep["inputs"]]
        return {"data": data, "event_data": None, "fn_index": dep["id"], "trigger_id": trigger,
                "session_hash": self.hash}

    async def queued(self, deps: list[dict], typed: dict | None = None) -> tuple[list[int], set[int]]:
        """Join ``deps`` on the queue and read this session's stream until all are answered: the changed States,
        and the ids of the deps that drew the status line (its output not a skip)."""
        events = {}
        for dep in deps:
            async with self.http.post(f"{self.url}{self.shape.prefix}/queue/join",
                                      json=self.body(dep, None, typed)) as reply:
                reply.raise_for_status()
                events[(await reply.json()).get("event_id")] = dep["id"]
        changed, drew = [], set()
        async with self.http.get(f"{self.url}{self.shape.prefix}/queue/data",
                                 params={"session_hash": self.hash}) as stream:
            async for line in stream.content:
                if line.startswith(b"data:"):
                    message = json.loads(line[5:])
                    output = message.get("output") or {}
                    changed += output.get("changed_state_ids") or []
                    self.stats["errors"] += message.get("success") is False
                    if self.drew_status(fn := events.get(message.get("event_id")), output):
                        drew.add(fn)
                    self.follow_pace(fn, output)
        return changed, drew

    def drew_status(self, fn: int | None, output: dict | bytes) -> bool:
        """Whether the answer ``output`` of event ``fn`` drew the status line (not a skip); an answer still in its
        JSON bytes is parsed only when ``fn`` is the status line's event."""
        if fn != self.shape.status_fn:
            return False
        return drawn(json.loads(output) if isinstance(output, bytes) else output, self.shape.status_at)

    def follow_pace(self, fn: int | None, output: dict) -> None:
        """Take the interval a tick's answer set for the page's timer, as the page's timer does."""
        at = self.shape.timer_at.get(fn)
        value = answered(output, at) if at is not None else None
        if isinstance(value, dict) and "value" in value:
            self.interval = float(value["value"])

    async def redraw(self, state: int) -> set[int]:
        """Call the change events of ``state`` (unqueued, as the page does); the id of one that drew the status
        line."""
        return await self.direct(self.shape.changes.get(state, []), state)

    async def direct(self, deps: list[dict], trigger: int | None = None) -> set[int]:
        """Call unqueued events, one after another; the id of one that drew the status line."""
        drew = set()
        for dep in deps:
            url = f"{self.url}{self.shape.prefix}/run/predict"
            async with self.http.post(url, json=self.body(dep, trigger)) as reply:
                body = await reply.read()  # read whole, as a page does; parsed only where it may draw the status line
            self.stats["errors"] += reply.status != 200
            self.stats["redraws"] += 1
            if reply.status == 200 and self.drew_status(dep["id"], body):
                drew.add(dep["id"])
        return drew

    async def predict(self) -> None:
        """This page's one prediction, as its Predict button sends it: a ratio drawn log-uniformly from 0.5x to 20x
        (the ratio box is the event's first input)."""
        guess = round(math.exp(random.uniform(math.log(0.5), math.log(20))), 1)
        await self.queued([self.shape.predict], {self.shape.predict["inputs"][0]: guess})
        self.stats["predicted"] += 1

    async def tick(self) -> set[int]:
        """One timer tick of every timer, then the redraws it asked for; the id of the event that drew the status
        line, if one did."""
        changed, drew = await self.queued(self.shape.ticks)
        self.stats["ticks"] += 1
        done = await asyncio.gather(*(self.redraw(state) for state in changed))
        return drew.union(*done)

    async def watch(self, stop: asyncio.Event) -> None:
        """Tick every ``interval`` until stopped (a slow tick delays the next, as a page's timer does)."""
        while not stop.is_set():
            began = time.monotonic()
            with contextlib.suppress(Exception):
                await self.tick()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, self.interval - (time.monotonic() - began)))


def client(timeout_s: float, connections: int):
    """The viewers' HTTP client: aiohttp, whose CPU per request is a fraction of httpx's, so that simulated pages
    take little of the cores they share with the server."""
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 connector=aiohttp.TCPConnector(limit=connections))


async def app_shape(http, url: str) -> AppShape:
    async with http.get(f"{url.rstrip('/')}/config") as reply:
        return AppShape(await reply.json())


def answered(output: dict, at: int):
    """An event's answer for its output ``at`` (None where the answer holds none)."""
    data = output.get("data") or []
    return data[at] if at < len(data) else None


def drawn(output: dict, at: int) -> bool:
    """Whether an event's answer set its output ``at`` (not a skip: an update with no value)."""
    value = answered(output, at)
    return not (isinstance(value, dict) and value.get("__type__") == "update" and "value" not in value)


async def new_page_status_s(http, url: str, shape: AppShape) -> float:
    """Seconds from a fresh page's GET / to its status line's redraw answered (load events, then ticks)."""
    began = time.monotonic()
    async with http.get(url) as reply:
        reply.raise_for_status()
        await reply.read()
    page = Session(http, url, shape, {"ticks": 0, "redraws": 0, "errors": 0})
    if shape.status_fn in await page.direct(shape.direct_loads):
        return time.monotonic() - began
    await page.queued(shape.loads)
    await asyncio.sleep(TICK_S)  # a gr.Timer first ticks one period after the page loads
    while shape.status_fn not in await page.tick():
        await asyncio.sleep(TICK_S)
    return time.monotonic() - began


async def simulate(url: str, sessions: int, report: Path, predict: bool = False) -> None:
    """Hold ``sessions`` pages until SIGTERM (each sends one prediction first, with ``predict``); then write their
    counts to ``report``."""
    stop, stats = asyncio.Event(), {"ticks": 0, "redraws": 0, "errors": 0, "predicted": 0, "sessions": sessions}
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with client(60.0, 4 * sessions + 8) as http:
        shape = await app_shape(http, url)
        pages = [Session(http, url, shape, stats) for _ in range(sessions)]
        if predict:
            await asyncio.gather(*(page.predict() for page in pages))
        began = time.monotonic()
        await asyncio.gather(*(page.watch(stop) for page in pages))
    wall = max(1e-9, time.monotonic() - began)
    stats["ticks_per_s_per_page"] = stats["ticks"] / wall / sessions
    stats["cpu_s_per_min"] = 60 * time.process_time() / wall  # near 60: the viewers' own CPU held them back
    report.write_text(json.dumps(stats))


# -- the bench: the app, the viewer processes, the runs ----------------------------------------------
def engines_cpu_seconds(pid: int) -> float:
    """CPU seconds of the engine host process and everything it started (vLLM's engine core and workers)."""
    import psutil

    total = cpu_seconds(pid)
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


@contextlib.contextmanager
def viewers(url: str, count: int, cpus: list[int], out: Path, predict: bool = False):
    """Viewer processes holding ``count`` sessions between them, one on each of ``cpus`` (each session predicting
    once first, with ``predict``); yields the paths their counts land in."""
    shares = [share for i in range(len(cpus)) if (share := count // len(cpus) + (i < count % len(cpus)))]
    reports = [out / f"viewers-{count}{'-predict' * predict}-{i}.json" for i in range(len(shares))]
    procs = [subprocess.Popen([sys.executable, "-m", "bench.viewers", "--simulate", url, "--sessions", str(share),
                               "--report", str(report), *(["--predict"] if predict else [])],
                              preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu}))
             for cpu, share, report in zip(cpus[:len(shares)], shares, reports, strict=True)]
    try:
        yield reports
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)


def merged_counts(reports: list[Path], sessions: int) -> dict:
    """The viewer processes' counts as one: ticks per page per second over all ``sessions`` asked for (a process
    that wrote nothing counts as no ticks), and the busiest process's CPU (near 60 s/min: it held its pages back)."""
    found = [json.loads(report.read_text()) for report in reports if report.exists()]
    if not found:
        return {}
    return {"sessions": sessions, "processes": f"{len(found)} of {len(reports)}",
            **{key: sum(each.get(key, 0) for each in found) for key in ("ticks", "redraws", "errors", "predicted")},
            "ticks_per_s_per_page": sum(e["ticks_per_s_per_page"] * e["sessions"] for e in found) / sessions,
            "cpu_s_per_min": max(each["cpu_s_per_min"] for each in found)}


def timed_new_pages(url: str, count: int, found: list) -> None:
    """Open ``count`` fresh pages one after another, appending each one's status-line seconds to ``found``."""
    async def pages():
        async with client(120.0, 8) as http:
            shape = await app_shape(http, url)
            for _ in range(count):
                found.append(await new_page_status_s(http, url, shape))

    asyncio.run(pages())


def one_count(count: int, url: str, client, meters: dict, args, predict: bool = False) -> dict:
    """The plan run once with ``count`` viewers watching (with ``predict``, predictions opened and each viewer's
    sent before the run): tok/s, CPU per minute, new pages' status seconds."""
    if predict:
        client.predict("ratio", api_name="/open_predictions")
    with viewers(url, count, args.viewer_cpus, Path(args.out), predict) as reports:
        time.sleep(args.watch_s)
        cpu, began, opened = {name: meter() for name, meter in meters.items()}, time.monotonic(), []
        pager = threading.Thread(target=timed_new_pages, args=(url, args.new_pages, opened), daemon=True)
        pager.start()
        summary = json.loads(client.predict(args.engines, args.users, args.workload, args.output_len,
                                            args.requests_per_user, args.repeats, api_name="/run_and_wait"))
        wall = time.monotonic() - began
        used = {name: meter() - cpu[name] for name, meter in meters.items()}
        pager.join(120)
    if summary.get("error"):
        raise RuntimeError(summary["error"])
    counts = merged_counts(reports, count)
    return {"viewers": count, "predict": predict, "wall_s": wall, "runs": summary["runs"], "new_page_s": opened,
            "counts": counts, "predictions": stored_predictions(summary["run_id"]) if predict else None,
            **{f"{name}_cpu_s_per_min": 60 * used[name] / wall for name in used}}


def stored_predictions(run_id: str) -> dict | None:
    """The predictions the app stored with run ``run_id`` (app.py keeps its runs in the default database)."""
    from lab.store import default_db_path, load_summary

    return load_summary(default_db_path(), run_id).get("predictions")


def measure(args) -> list[dict]:
    """Every viewer count in turn on one app; written to --out/viewers.json after each."""
    import psutil

    found = []
    with serving_app(args) as (url, client, _):
        app_pid = next(p.pid for p in psutil.Process().children() if "app.py" in p.cmdline())
        host = host_pid(app_pid)
        meters = {"page": lambda: cpu_seconds(app_pid), "engines": lambda: engines_cpu_seconds(host)}
        for count in args.viewers:
            for predict in (False, True) if args.predict else (False,):
                found.append(one_count(count, url, client, meters, args, predict))
                (Path(args.out) / "viewers.json").write_text(json.dumps(found, indent=1))
                print(row(found[-1]), flush=True)
    return found


# -- the table -------------------------------------------------------------------------------------
def levels(found: list[dict]) -> list[tuple[str, int]]:
    return sorted(tok_s_spreads(found[0]["runs"]))


def row(item: dict) -> str:
    """One viewer count: CPU per minute, the new pages' status seconds, tok/s per level (mean [low-high])."""
    spreads = tok_s_spreads(item["runs"])
    rates = "  ".join(f"{e}@{u} {s.mean:.1f} [{s.low:.1f}-{s.high:.1f}]" for (e, u), s in sorted(spreads.items()))
    pages = ",".join(f"{s:.1f}" for s in item["new_page_s"]) or "-"
    counts = item.get("counts", {})
    viewers = f"{item['viewers']}{'+p' if item.get('predict') else ''}"  # +p: every page predicted first
    return (f"{viewers:>7}  {item['page_cpu_s_per_min']:>14.1f}  {item['engines_cpu_s_per_min']:>17.1f}  "
            f"{item['wall_s']:>6.1f}  {pages:>16}  {counts.get('ticks_per_s_per_page', 0):>9.2f}  "
            f"{counts.get('cpu_s_per_min', 0):>10.1f}  {rates}")


HEADER = ("viewers  page CPU s/min  engines CPU s/min  wall s  new page status s  ticks/s/pg  viewers' CPU  "
          "output tok/s per engine@users: mean [low-high over repeats]")


def verdict(found: list[dict]) -> str:
    """Whether every level's mean tok/s with the most viewers lies within the fewest viewers' repeat spread (a
    count measured twice, as in 1,50,1, pools its blocks: the spread then holds the machine's drift between them);
    with --predict, the blocks without predictions, then each count's with predictions against its own without."""
    plain = [item for item in found if not item.get("predict")]
    return "\n".join([watched_verdict(plain)] + [predict_verdict(found, count) for count in
                                                 sorted({item["viewers"] for item in found if item.get("predict")})])


def predict_verdict(found: list[dict], count: int) -> str:
    """Each level's mean tok/s with ``count`` viewers that predicted against its spread with ``count`` that did not,
    and how many predictions the run took along."""
    base = tok_s_spreads(block_runs([i for i in found if not i.get("predict")], count))
    top = tok_s_spreads(block_runs([i for i in found if i.get("predict")], count))
    taken = [len((item.get("predictions") or {}).get("values", [])) for item in found
             if item.get("predict") and item["viewers"] == count]
    out = [f"{e}@{u}: {top[(e, u)].mean:.1f} with {count} predicting viewers vs [{s.low:.1f}-{s.high:.1f}] without: "
           f"{placed(top[(e, u)].mean, s)}" for (e, u), s in sorted(base.items()) if (e, u) in top]
    return "\n".join(out + [f"predictions the run took along: {', '.join(map(str, taken))}"])


def watched_verdict(found: list[dict]) -> str:
    """The fewest viewers against the most (verdict's first part)."""
    fewest, most = min(item["viewers"] for item in found), max(item["viewers"] for item in found)
    base, top = tok_s_spreads(block_runs(found, fewest)), tok_s_spreads(block_runs(found, most))
    out = [f"{e}@{u}: {top[(e, u)].mean:.1f} with {most} viewers vs [{s.low:.1f}-{s.high:.1f}] with {fewest}: "
           f"{placed(top[(e, u)].mean, s)}" for (e, u), s in sorted(base.items())]
    worst = max((s for item in found for s in item["new_page_s"]), default=float("nan"))
    return "\n".join(out + [f"slowest new page's status line: {worst:.1f} s (target 3 s)"])


def placed(mean: float, spread) -> str:
    """Where a mean lies against a spread: within, or OUTSIDE and on which side (below: the viewers cost it)."""
    if mean < spread.low:
        return "OUTSIDE, below"
    return "OUTSIDE, above" if mean > spread.high else "within"


def block_runs(found: list[dict], count: int) -> list[dict]:
    """The runs of every block with ``count`` viewers, their repeats numbered on from block to block."""
    blocks = [item["runs"] for item in found if item["viewers"] == count]
    return [{**run, "repeat": 1000 * k + run.get("repeat", 0)} for k, runs in enumerate(blocks) for run in runs]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewers", default="1,10,50", help="viewer counts, in turn (comma list; a count given "
                        "twice, as in 1,50,1, is pooled in the verdict)")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--users", default="1,4")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--watch-s", type=float, default=8.0, help="viewers watch this long before the run")
    parser.add_argument("--new-pages", type=int, default=3, help="fresh pages timed during each run")
    parser.add_argument("--viewer-cpus", type=int, default=1, help="viewer processes, one on each of the last this "
                        "many CPUs (one process's CPU bounds how many ticks it sends: ticks/s/pg says)")
    parser.add_argument("--predict", action="store_true", help="run each count twice: without, then with the room's "
                        "predictions (opened as the presenter; every viewer predicts once before the run)")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--simulate", default=None, metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    args.viewers = [int(v) for v in args.viewers.split(",")]
    if min(args.viewers) < 1:
        parser.error(f"--viewers: each count must be >= 1, not {min(args.viewers)}")
    args.viewer_cpus = sorted(os.sched_getaffinity(0))[-max(1, args.viewer_cpus):]
    args.out = args.out or tempfile.mkdtemp(prefix="kvlab-viewers-")
    everything = set(os.sched_getaffinity(0))
    args.cpus = (everything, everything)  # the app and this bench share every CPU (the viewers: the last ones)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.simulate:
        asyncio.run(simulate(args.simulate, args.sessions, Path(args.report), args.predict))
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(f"app log and viewers.json in {args.out}\n{HEADER}", flush=True)
    found = measure(args)
    print(verdict(found))


if __name__ == "__main__":
    main()
