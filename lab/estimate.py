"""How long a run will take here, from start to end, computed from what the stored runs of this device measured.

A run is its engines' warm-ups, its levels, the pauses between levels (vLLM's settle before another engine,
each level's start and stop) and, when an engine of the plan is dead, its restart first. Each part comes from
the stored runs of this device and model:

- a level takes its rounds times the time to a first token, plus its critical path of decode steps times the
  time per step. The critical path comes from the plan's own seeded lengths (a static batch runs until its
  longest request; continuous batching hands each free user the next request). The two times are those of
  the engine's nearest stored user level, the step time fitted so that the stored level's own critical path
  gives its measured duration;
- a warm-up takes the engine's stored warm-up time; a pause, what stored runs took beyond their warm-ups,
  levels and settles, per level.

Without a stored run of an engine, a built-in first guess stands in (measured once on a 2-core CPU,
docs/results/cpu-estimates.md) and the text says so.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field

from lab.config import LoadConfig, RunPlan, duration_words
from lab.engines import registry
from lab.load.workloads import WORKLOADS, sample_specs
from lab.runs import SETTLE_S, level_seed

HISTORY_RUNS = 50  # the newest stored runs read (older ones describe an older lab)
FIRST_GUESS_NOTE = "a built-in first guess from a 2-core CPU (docs/results/cpu-estimates.md)"


@dataclass(frozen=True)
class LevelTiming:
    """What one stored level measured: time to a first token and time per decode step, at ``users``."""

    users: int
    first_s: float
    step_s: float


# The first guess: the levels, warm-ups and pause measured by `python -m bench.estimates` on a 2-core AMD EPYC
# (its calibration run); read only for an engine this device has no stored run of.
FIRST_GUESS = {
    "hf": [LevelTiming(1, 0.12, 0.075), LevelTiming(4, 0.25, 0.09), LevelTiming(8, 0.4, 0.11)],
    "vllm": [LevelTiming(1, 0.1, 0.03), LevelTiming(4, 0.15, 0.04), LevelTiming(8, 0.25, 0.05)],
}
FIRST_WARMUP_S = {"hf": 1.5, "vllm": 1.0}
FIRST_GAP_S = 0.3


@dataclass(frozen=True)
class History:
    """The timings stored runs of one device and model measured (newest first), and the engines that have none."""

    levels: dict[str, list[LevelTiming]] = field(default_factory=dict)
    warmups: dict[str, float] = field(default_factory=dict)
    gap_s: float | None = None
    runs: int = 0

    def timings(self, engine: str) -> list[LevelTiming]:
        """The engine's stored levels, or the first guess (an endpoint with neither: vLLM's guess)."""
        return self.levels.get(engine) or FIRST_GUESS.get(engine) or FIRST_GUESS["vllm"]

    def guessed(self, engines) -> list[str]:
        """The engines of ``engines`` that no stored run measured."""
        return [engine for engine in engines if engine not in self.levels]


def history(summaries: list[dict], model: str, device_name: str) -> History:
    """The timings of the stored runs (summary.json dicts, newest first) of this device and model."""
    mine = [s for s in summaries if s.get("model") == model and s.get("device", {}).get("name") == device_name]
    mine = mine[:HISTORY_RUNS]
    levels: dict[str, list[LevelTiming]] = {}
    for summary in mine:
        for row in summary.get("runs", []):
            if (timing := level_timing(summary, row)) is not None:
                levels.setdefault(row["engine"], []).append(timing)
    gaps = [g for s in mine if (g := gap_per_level(s)) is not None]
    return History(levels, _median_warmups(mine), statistics.median(gaps) if gaps else None, len(mine))


def _median_warmups(summaries: list[dict]) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for summary in summaries:
        for engine, seconds in (summary.get("warmup_s") or {}).items():
            found.setdefault(engine, []).append(seconds)
    return {engine: statistics.median(values) for engine, values in found.items()}


def level_timing(summary: dict, row: dict) -> LevelTiming | None:
    """A stored level's time to a first token and its step time fitted to its measured duration (its own
    critical path, rebuilt from the stored seed and lengths), or None when it finished nothing."""
    first, tpot = row["ttft_s"].get("mean"), row["tpot_s"].get("mean")
    if not row.get("completed") or first is None or row.get("status") not in (None, "ok"):
        return None
    path = stored_path(summary, row)
    step = (row["duration_s"] - path[0] * first) / path[1] if path and path[1] else None
    step = step if step and step > 0 else tpot
    return LevelTiming(row["users"], first, step) if step else None


def stored_path(summary: dict, row: dict) -> tuple[int, int] | None:
    """The critical path (rounds, steps) of a stored count-bounded closed-loop level; None for others."""
    load = summary.get("load", {})
    if not load.get("requests_per_user") or load.get("rate") or summary.get("workload") not in WORKLOADS:
        return None
    config = LoadConfig(users=(row["users"],), workload=summary["workload"], seed=load.get("seed", 0),
                        requests_per_user=load["requests_per_user"], output_len=load.get("output_len"))
    batch = summary.get("engine_args", {}).get(row["engine"], {}).get("max_batch_size")
    return critical_path(planned_outputs(config, row["users"]), row["users"], _static(row["engine"]), batch)


def gap_per_level(summary: dict) -> float | None:
    """What a stored ok run took beyond its warm-ups, levels and settles, per level (None without wall_s)."""
    wall, rows = summary.get("wall_s"), summary.get("runs", [])
    if not wall or not rows or summary.get("status") != "ok":
        return None
    settles = settle_count([row["engine"] for row in rows])
    spent = sum((summary.get("warmup_s") or {}).values()) + sum(row["duration_s"] for row in rows)
    return max(0.0, (wall - spent - settles * SETTLE_S) / len(rows))


def settle_count(order: list[str]) -> int:
    """How many times a run waits SETTLE_S: before each level whose engine differs from a vLLM-pool one's."""
    return sum(1 for last, name in zip(order, order[1:], strict=False)
               if last != name and _has_pool(last))


def _has_pool(engine: str) -> bool:
    return engine in registry.names() and registry.spec(engine).kv_pool


def _static(engine: str) -> bool:
    return engine in registry.names() and registry.spec(engine).static_batch


def planned_outputs(load: LoadConfig, users: int) -> list[int]:
    """The output lengths one count-bounded level sends (the run's own seeded lengths), in sending order."""
    specs = sample_specs(load.workload, users * load.requests_per_user, level_seed(load, users), load.output_len)
    return [spec.output_len for spec in specs]


def critical_path(outputs: list[int], users: int, static: bool, batch: int | None = None) -> tuple[int, int]:
    """(rounds, decode steps) of the slowest chain of one level: a static batch of min(users, batch) runs
    until its longest request; otherwise each user takes the next request as it frees (its steps its length)."""
    if static:
        width = min(users, batch or users)
        chunks = [outputs[i:i + width] for i in range(0, len(outputs), width)]
        return len(chunks), sum(max(chunk) for chunk in chunks)
    busy = [(0, 0)] * min(users, len(outputs))  # (steps, rounds) per user: the free one takes the next
    for out in outputs:
        steps, rounds = heapq.heappop(busy)
        heapq.heappush(busy, (steps + out, rounds + 1))
    return max(busy)[::-1] if busy else (0, 0)


def nearest(timings: list[LevelTiming], users: int) -> LevelTiming:
    """The timing measured at the user level nearest ``users`` (by ratio: 5 is nearer 4 than 10 is)."""
    return min(timings, key=lambda t: abs(math.log(t.users / users)))


def level_seconds(plan: RunPlan, engine: str, users: int, timing: LevelTiming) -> float:
    """One level of one engine: its rounds and critical path at the timing's speeds (a level bounded by time:
    its duration plus the tail of one longest request)."""
    load = plan.load
    if load.duration_s:
        longest = load.output_len or WORKLOADS[load.workload].output_len[1]
        return load.duration_s + timing.first_s + longest * timing.step_s
    rounds, steps = critical_path(planned_outputs(load, users), users, _static(engine), plan.engine.hf_max_batch_size)
    busy = rounds * timing.first_s + steps * timing.step_s
    return max(busy, users * load.requests_per_user / load.rate + timing.first_s) if load.rate else busy


@dataclass(frozen=True)
class Estimate:
    """Seconds the run should take, how many stored runs it came from, and the engines only guessed."""

    seconds: float
    runs: int
    guessed: tuple[str, ...]


def estimate_run(plan: RunPlan, past: History, restarts: dict[str, float] | None = None) -> Estimate:
    """Warm-ups, levels (each repeat), pauses and settles, and the restarts of dead engines (their last start)."""
    load, engines = plan.load, plan.engines
    levels = sum(level_seconds(plan, e, u, nearest(past.timings(e), u)) for e in engines for u in load.users)
    order = [e for _ in range(len(load.users) * load.repeats) for e in engines]
    warmups = sum(past.warmups.get(e, FIRST_WARMUP_S.get(e, FIRST_WARMUP_S["vllm"])) for e in engines)
    gaps = len(order) * (FIRST_GAP_S if past.gap_s is None else past.gap_s) + settle_count(order) * SETTLE_S
    total = levels * load.repeats + (warmups if load.warmup_requests else 0) + gaps
    return Estimate(total + sum((restarts or {}).values()), past.runs, tuple(past.guessed(engines)))


def estimate_text(plan: RunPlan, summaries: list[dict], model: str, device_name: str,
                  restarts: dict[str, float] | None = None) -> str:
    """One line for the page under the form: the estimate and what it was computed from."""
    estimate = estimate_run(plan, history(summaries, model, device_name), restarts)
    restart = f", restarting {', '.join(restarts)} first" if restarts else ""
    if estimate.guessed:
        source = (f"{FIRST_GUESS_NOTE} for {', '.join(estimate.guessed)}: no finished run of "
                  f"{'it' if len(estimate.guessed) == 1 else 'them'} is stored for {device_name} yet")
    else:
        source = f"the {estimate.runs} stored run{'s' if estimate.runs != 1 else ''} of {device_name}"
    return (f"Estimated time: about {duration_words(estimate.seconds)}{restart} (computed from {source}; "
            "warm-up and pauses included).")
