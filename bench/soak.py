"""Run the lab all day: back-to-back short runs for a set time, with the figures that would show a leak.

Starts the app's engine host (its own process, as app.py does: both engines, the results database; no
browser), then submits one short run after another, as a workshop's Run presses would, and records after
each run: its vLLM tok/s at the top level, the engine host process's resident memory, open file descriptors
and threads, each engine process's resident memory (vLLM's engine core and its worker: children of the host
process), this process's (the page's side: the mirror of the runs) and the results database's size. At the
end it prints every run, the growth from the first runs to the last, and flags a trend (memory or descriptors
growing beyond noise, tok/s falling).

Usage: python -m bench.soak [--minutes 30] [--runs N] [--users 1,5] [--output-len 32] [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from lab.app.host_process import RemoteHost
from lab.config import EngineConfig, LoadConfig, RunPlan, parse_users

log = logging.getLogger("soak")
MIB = 2**20
LIMITS = {"lab_rss_mib": 0.05, "children_rss_mib": 0.05, "page_rss_mib": 0.05, "fds": 0.10,
          "threads": 0.10}  # relative growth allowed
TOK_S_DROP = 0.15  # a fall of tok/s beyond this (last runs vs first) is flagged


@dataclass
class Sample:
    """One run of the soak and the process figures read right after it."""

    run: int
    elapsed_s: float
    status: str
    vllm_tok_s: float | None
    lab_rss_mib: float
    children_rss_mib: float
    children: int
    page_rss_mib: float  # this process: the page's side (RemoteHost and its mirror of the runs)
    fds: int
    threads: int
    db_kib: float


def read_sample(host, index: int, began_s: float, result) -> Sample:
    """The figures of the engine host process, its engine processes, this process and the database, after
    run ``index``."""
    me = psutil.Process(host._pid)  # the process that drives the engines (the app's engine host)
    kids = me.children(recursive=True)
    top = max(result.plan.load.users)
    tok = [lvl.summary.output_tok_s for lvl in result.levels
           if lvl.engine == "vllm" and lvl.users == top and lvl.summary]
    return Sample(
        run=index, elapsed_s=round(time.monotonic() - began_s, 1), status=str(result.status),
        vllm_tok_s=round(statistics.fmean(tok), 1) if tok else None,
        lab_rss_mib=round(me.memory_info().rss / MIB, 1),
        children_rss_mib=round(sum(_rss(k) for k in kids) / MIB, 1), children=len(kids),
        page_rss_mib=round(psutil.Process().memory_info().rss / MIB, 1),
        fds=me.num_fds() + sum(_fds(k) for k in kids), threads=me.num_threads(),
        db_kib=round(Path(host.db_path).stat().st_size / 1024, 1),
    )


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _fds(process: psutil.Process) -> int:
    try:
        return process.num_fds()
    except psutil.Error:
        return 0


def soak(host, plan: RunPlan, minutes: float | None = None, runs: int | None = None,
         on_sample=None) -> list[Sample]:
    """Submit ``plan`` back to back on a ready host until ``minutes`` pass or ``runs`` are done."""
    samples: list[Sample] = []
    began = time.monotonic()
    deadline = None if minutes is None else began + minutes * 60
    while (runs is None or len(samples) < runs) and (deadline is None or time.monotonic() < deadline):
        started, message = host.submit(plan)
        if not started:
            raise RuntimeError(f"the soak's run did not start: {message}")
        result = host.wait_task()
        samples.append(read_sample(host, len(samples) + 1, began, result))
        if on_sample:
            on_sample(samples[-1])
    return samples


def growth(samples: list[Sample]) -> dict[str, dict]:
    """Per figure: median of the first third of the runs (the first run is the warm-up and left out),
    median of the last third, the change, and whether it is a trend (beyond LIMITS, or tok/s down)."""
    steady = samples[1:] if len(samples) > 2 else samples
    third = max(1, len(steady) // 3)
    out = {}
    for name in (*LIMITS, "vllm_tok_s", "db_kib"):
        values = [getattr(s, name) for s in steady if getattr(s, name) is not None]
        if not values:
            continue
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        change = (last - first) / first if first else 0.0
        if name in LIMITS:
            trend = change > LIMITS[name]
        else:
            trend = name == "vllm_tok_s" and change < -TOK_S_DROP
        out[name] = {"first": first, "last": last, "change": change, "trend": trend}
    return out


def report(samples: list[Sample], grown: dict[str, dict]) -> str:
    """The runs as a table, then the growth lines."""
    names = list(asdict(samples[0])) if samples else []
    lines = ["  ".join(names)]
    lines += ["  ".join(f"{value!s:>{len(name)}}" for name, value in asdict(s).items()) for s in samples]
    lines.append(f"growth, median of the first third of runs -> last third ({len(samples)} runs, "
                 f"the first left out as warm-up):")
    for name, g in grown.items():
        flag = "  <- TREND" if g["trend"] else ""
        note = "  (grows by design: one stored run each)" if name == "db_kib" else ""
        lines.append(f"  {name:<17} {g['first']:>10.1f} -> {g['last']:>10.1f}  ({g['change']:+.1%}){flag}{note}")
    trends = [name for name, g in grown.items() if g["trend"]]
    lines.append("verdict: " + (f"trend in {', '.join(trends)}" if trends else "no growth beyond noise"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=None, help="stop after this many runs instead")
    parser.add_argument("--users", default="1,5")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--csv", default=None, help="also write every run's figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before the host process starts: it inherits it
    config = EngineConfig()
    host = RemoteHost(config, db_path=Path(tempfile.mkdtemp(prefix="kvlab-soak-")) / "results.sqlite")
    host.start_loading()
    if not host.wait_ready(600):
        raise SystemExit(f"engines did not load: {host.status.text()}")
    plan = RunPlan(engines=("hf", "vllm"), engine=config,
                   load=LoadConfig(users=parse_users(args.users), requests_per_user=1, output_len=args.output_len))
    try:
        samples = soak(host, plan, None if args.runs else args.minutes, args.runs,
                       lambda s: print(f"run {s.run} ({s.elapsed_s:.0f} s): {s.status}, vLLM {s.vllm_tok_s} tok/s, "
                                       f"lab {s.lab_rss_mib} MiB, engines {s.children_rss_mib} MiB, "
                                       f"{s.fds} fds", flush=True))
    finally:
        host.close()
    print(report(samples, growth(samples)))
    if args.csv and samples:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(samples[0])))
            writer.writeheader()
            writer.writerows(asdict(s) for s in samples)


if __name__ == "__main__":
    main()
