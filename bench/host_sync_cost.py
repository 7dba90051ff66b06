"""What keeping the page's copy of a live run costs the engines' process (lab.app.host_process, lab.app.mirror).

The app's engine process answers the page's process every SYNC_S with what is new: it cuts it on its event
loop, the loop that also runs vLLM's async front end, and pickles it there. This loads the engines in this
process behind the same HostService, runs a plan, and syncs a mirror at the app's pace while the run goes,
timing each cut on the loop (the loop's milliseconds per second are what the engines lose) and the caller's
CPU for the whole answer (the header: status, health), beside the run's tok/s. ``--made-up`` instead times
the cut of a made-up H100-sized level (bench.redraw_cost's: a step and a token per request every 3 ms) as
the page finds it every SYNC_S: the last SYNC_S of records and samples new, every user's request in flight.
Usage: python -m bench.host_sync_cost [--engines vllm] [--users 8] [--requests-per-user 4] [--output-len 64]
       [--made-up] [engine options of lab bench, e.g. --device cuda --model DIR --load-format dummy]
"""

from __future__ import annotations

import argparse
import logging
import pickle
import statistics
import tempfile
import threading
import time
from pathlib import Path

import lab.app.host_process as host_process
from bench.redraw_cost import STEP_S, made_up_run
from lab.app.mirror import apply_run, holding, run_part
from lab.config import LoadConfig, RunPlan, parse_users
from lab.options import add_engine_args, engine_config_from


class TimedCut:
    """lab.app.host_process._cut with the loop's seconds in each call noted."""

    def __init__(self, cut):
        self.cut, self.loop_s, self.bytes = cut, [], []

    def __call__(self, host, version, held):
        began = time.perf_counter()
        found = self.cut(host, version, held)
        self.loop_s.append(time.perf_counter() - began)
        self.bytes.append(len(found[2] or b""))
        return found


def follow(service, done: threading.Event) -> list[float]:
    """Sync a mirror every SYNC_S until ``done``, as the page's process does; the caller's CPU per answer."""
    mirror, version, caller_s = None, 0, []
    while not done.wait(host_process.SYNC_S):
        began = time.thread_time()
        snap = service.sync(version, (holding(mirror), None, None))
        caller_s.append(time.thread_time() - began)
        if snap.parts is not None:
            mirror, version = apply_run(mirror, pickle.loads(snap.parts)[0]), snap.version
    return caller_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="vllm")
    parser.add_argument("--users", default="8")
    parser.add_argument("--requests-per-user", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--made-up", action="store_true", help="time cuts of a made-up H100-sized level instead")
    add_engine_args(parser)
    args = parser.parse_args()
    if args.made_up:
        made_up_cuts(parse_users(args.users), args.requests_per_user, args.output_len)
        return
    logging.basicConfig(level=logging.WARNING)
    timed = host_process._cut = TimedCut(host_process._cut)
    service = host_process.HostService()
    engines = tuple(args.engines.split(","))
    service.init(engine_config_from(args), engines, str(Path(tempfile.mkdtemp()) / "results.sqlite"))
    host = service.host
    host.start_loading()
    try:
        if not host.wait_ready(900):
            raise SystemExit(f"engines did not load: {host.status.text()}")
        load = LoadConfig(users=parse_users(args.users), requests_per_user=args.requests_per_user,
                          output_len=args.output_len)
        report(service, RunPlan(engines=engines, engine=host.config, load=load), timed)
    finally:
        host.close()


def made_up_cuts(users: tuple[int, ...], per_user: int, output_len: int, repeats: int = 20) -> None:
    """The cut of a running made-up level, the mirror one SYNC_S behind, every user's request in flight."""
    for level_users in users:
        run = made_up_run([level_users], per_user, output_len, 1)
        level = run.levels[-1]
        # the page looks half way through the level, half way through every user's request (they go in step)
        middle = min(r.send_s for r in level.sent) + (per_user // 2 + 0.5) * (output_len + 1) * STEP_S
        level.samples = [s for s in level.samples if s.time_s <= middle]
        level.records = [r for r in level.records if r.end_s <= middle]
        level.sent = [r for r in level.sent if r.send_s <= middle]
        for record in level.sent:
            if record.end_s > middle:
                record.token_times_s = [t for t in record.token_times_s if t <= middle]
                record.end_s = None
        steps = int(host_process.SYNC_S / STEP_S)
        recent = sum(1 for r in level.records if r.end_s > middle - host_process.SYNC_S)
        held = (run.id, ((len(level.records) - recent, len(level.samples) - steps, False),))
        took = []
        for _ in range(repeats):
            began = time.perf_counter()
            size = len(pickle.dumps(run_part(run, held), pickle.HIGHEST_PROTOCOL))
            took.append(time.perf_counter() - began)
        cut_s = statistics.median(took)
        print(f"{level_users} users: {len(level.in_flight())} in flight, {recent} records and {steps} samples new; "
              f"cut + pickle ms p50 {1e3 * cut_s:.2f} ({size / 1024:.0f} KiB), loop ms per second at one cut "
              f"per {host_process.SYNC_S} s: {1e3 * cut_s / host_process.SYNC_S:.1f}")


def report(service, plan: RunPlan, timed: TimedCut) -> None:
    """Run ``plan`` while a mirror follows it; print the costs per answer and per second."""
    host, done, caller_s = service.host, threading.Event(), []
    started, message = host.submit(plan)
    if not started:
        raise SystemExit(message)
    follower = threading.Thread(target=lambda: caller_s.extend(follow(service, done)))
    follower.start()
    result = host.wait_task()
    done.set()
    follower.join()
    tok_s = ", ".join(f"{lvl.engine}@{lvl.users} {lvl.summary.output_tok_s:,.0f}" for lvl in result.levels)
    per_s = sum(timed.loop_s) / sum(lvl.summary.duration_s for lvl in result.levels)
    print(f"run {result.status}: output tok/s {tok_s}")
    print(f"{len(caller_s)} answers: loop ms per cut p50 {1e3 * statistics.median(timed.loop_s):.2f}, max "
          f"{1e3 * max(timed.loop_s):.2f}; loop ms per second of run {1e3 * per_s:.2f}; answer CPU ms p50 "
          f"{1e3 * statistics.median(caller_s):.2f}; KiB per cut p50 {statistics.median(timed.bytes) / 1024:.1f}")


if __name__ == "__main__":
    main()
