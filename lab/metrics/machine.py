"""How busy the machine was during a level: the CPU time of processes outside the lab, and the hypervisor's steal.

A level's tok/s is the engines' only if they had the machine. On a shared 2-core CPU another process (a test
suite, a second app) or a neighbour VM (steal) slows one level and not the next, and a ratio below 1 then reads
as the engines' doing. ``sample`` reads the kernel's counters (Linux /proc: the machine's CPU time by kind, and the
CPU time of the lab's own process tree, the engines' worker processes included); ``between`` turns the samples at
a level's start and end into what other processes and steal took over the level, in cores (measured);
``disturbed`` is the one rule that calls a level disturbed. Standard library only, a few milliseconds a sample;
where /proc is missing (not Linux) nothing is sampled and nothing is said.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# A level is disturbed when, on average over its wall time, processes outside the lab used at least a quarter of a
# core: on the 2-core CPU the engines keep both cores busy (HF's torch threads, vLLM's worker), so a quarter core
# taken is about an eighth of their CPU, more than the 1-6% two runs of a level differed by on the quiet machine
# (docs/results/cpu-workshop-demo.txt, the top level's ratio in runs 2 and 3).
OTHERS_CORES = 0.25
# ...or when the hypervisor took at least 5% of the machine's CPU time (steal): the vCPUs waited for a neighbour VM.
STEAL_SHARE = 0.05
ROOT_ENV = "KVLAB_ROOT_PID"  # the lab's top process (the app's page, which starts the engine host); else this one
PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """One reading: when (monotonic s), the machine's busy, steal and total CPU ticks, the lab tree's CPU ticks,
    and the machine's cores."""

    wall_s: float
    busy: int
    steal: int
    total: int
    lab: int
    cores: int


def parse_stat(text: str) -> tuple[int, int, int, int]:
    """(busy, steal, total ticks, cores) from /proc/stat: busy is user + nice + system + irq + softirq (guest time
    is inside user), total adds idle, iowait and steal."""
    lines = text.splitlines()
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in lines[0].split()[1:9])
    busy = user + nice + system + irq + softirq
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return busy, steal, busy + idle + iowait + steal, cores


def parse_process(text: str) -> tuple[int, int, int]:
    """(pid, parent pid, CPU ticks) from one /proc/PID/stat: its user and system time and those of its children it
    has waited for (a worker that ended stays counted)."""
    pid, _, rest = text.partition(" (")
    fields = rest[rest.rindex(")") + 2:].split()  # the name may hold spaces and parentheses: cut at the last ')'
    return int(pid), int(fields[1]), sum(int(x) for x in fields[11:15])


def processes(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """Every process's (parent pid, CPU ticks); one that ends while being read is left out."""
    found = {}
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                pid, parent, ticks = parse_process((proc / entry.name / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            found[pid] = (parent, ticks)
    return found


def tree_ticks(found: dict[int, tuple[int, int]], root: int) -> int:
    """The CPU ticks of ``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in found.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += found.get(pid, (0, 0))[1]
        todo += children.get(pid, [])
    return total


def lab_root() -> int:
    """The lab's top process: ROOT_ENV when the app set it for its engine host, else this process."""
    value = os.environ.get(ROOT_ENV, "")
    return int(value) if value.isdigit() else os.getpid()


def sample(root: int | None = None, proc: Path = PROC) -> Sample | None:
    """The machine's counters and the lab tree's CPU now; None where /proc cannot be read."""
    try:
        busy, steal, total, cores = parse_stat((proc / "stat").read_text())
        lab = tree_ticks(processes(proc), lab_root() if root is None else root)
    except (OSError, ValueError):
        return None
    return Sample(time.monotonic(), busy, steal, total, lab, cores or os.cpu_count() or 1)


def between(before: Sample | None, after: Sample | None, hertz: int | None = None) -> dict | None:
    """What the machine did between two samples, as average cores over the wall time (measured): ``others`` (CPU
    outside the lab's processes), ``steal`` (taken by the hypervisor) and ``lab`` (the lab's own); None without
    both samples or time between them."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    hertz = hertz or os.sysconf("SC_CLK_TCK")
    seconds = after.wall_s - before.wall_s
    lab = after.lab - before.lab
    others = max(0, after.busy - before.busy - lab)

    def cores(ticks: int) -> float:
        return round(ticks / hertz / seconds, 3)

    return {"others_cores": cores(others), "steal_cores": cores(after.steal - before.steal),
            "lab_cores": cores(lab), "cores": after.cores, "seconds": round(seconds, 3)}


def disturbed(machine: dict | None) -> bool:
    """Whether a level's machine (``between``'s dict) was shared enough to move its figures: other processes used
    OTHERS_CORES or more while the machine had less than OTHERS_CORES idle (on a 2-core CPU the engines keep both
    cores busy, so any such use competes; on a 16-core GPU host, other processes on idle cores take nothing from
    the lab), or steal took STEAL_SHARE of the machine or more."""
    if not machine:
        return False
    busy = machine["others_cores"] + machine.get("lab_cores", machine["cores"])
    crowded = machine["others_cores"] >= OTHERS_CORES and busy > machine["cores"] - OTHERS_CORES
    return crowded or machine["steal_cores"] >= STEAL_SHARE * machine["cores"]
