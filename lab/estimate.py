"""How long a run will take here, from start to end, computed from what the stored runs of this device measured.

A run is its engines' warm-ups, its levels, the pauses between levels (vLLM's settle before another engine,
each level's start and stop) and, when an engine of the plan is dead, its restart first. Each part comes from
the stored runs of this device and model:

- a level takes the prompt tokens it prefills times the time per prompt token, plus its critical path of
  decode steps times the time per step. Both counts come from the plan's own seeded lengths (a static batch
  pads its prompts to the longest and runs until its longest request; continuous batching prefills every
  prompt and hands each free user the next request). The two times are interpolated between the engine's
  stored user levels around the plan's (in log users): the time per prompt token from a stored level's time to
  a first token over the prompt tokens a first token waits for, the step time fitted so that the stored level's
  own counts give its measured duration;
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
MEDIAN_OF = 5  # stored levels per engine and user level whose median the estimate takes
FIRST_GUESS_NOTE = "a built-in first guess from a 2-core CPU (docs/results/cpu-estimates.md)"


@dataclass(frozen=True)
class LevelTiming:
    """What one stored level measured at ``users``: seconds per prompt token prefilled, per decode step."""

    users: int
    prefill_s: float
    step_s: float


@dataclass(frozen=True)
class LevelShape:
    """What a level asks of an engine: the prompt tokens it prefills (a static batch's padding too), the prompt
    tokens one first token waits for, and the decode steps of its slowest chain."""

    prefill: int
    wave: float
    steps: int


# The first guess: the median timings of `python -m bench.estimates`'s six runs on a 2-core AMD EPYC shared with
# other work (docs/results/cpu-estimates.md); read only for an engine this device has no stored run of.
FIRST_GUESS = {
    "hf": [LevelTiming(1, 0.0026, 0.093), LevelTiming(4, 0.0035, 0.197), LevelTiming(10, 0.0021, 0.477)],
    "vllm": [LevelTiming(1, 0.0013, 0.038), LevelTiming(4, 0.0015, 0.050), LevelTiming(10, 0.0011, 0.043)],
}
FIRST_WARMUP_S = {"hf": 1.2, "vllm": 0.64}
FIRST_GAP_S = 0.03


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
    """A stored level's time per prompt token (its mean time to a first token over the prompt tokens a first token
    waits for) and its step time fitted to its measured duration, both from its own counts (rebuilt from the
    stored seed and lengths); None when it finished nothing or cannot be rebuilt (bounded by time, open loop)."""
    first, shape = row["ttft_s"].get("mean"), stored_shape(summary, row)
    if not row.get("completed") or first is None or row.get("status") not in (None, "ok") or shape is None:
        return None
    prefill = first / shape.wave if shape.wave else 0.0
    step = (row["duration_s"] - prefill * shape.prefill) / shape.steps if shape.steps else 0.0
    if step <= 0:  # the first token's wait was not prefill alone: the tokens' own mean gap instead
        step = row["tpot_s"].get("mean") or 0.0
        prefill = max(0.0, row["duration_s"] - step * shape.steps) / shape.prefill if shape.prefill else 0.0
    return LevelTiming(row["users"], prefill, step)


def stored_shape(summary: dict, row: dict) -> LevelShape | None:
    """The shape of a stored count-bounded closed-loop level (None for others)."""
    load = summary.get("load", {})
    if not load.get("requests_per_user") or load.get("rate") or summary.get("workload") not in WORKLOADS:
        return None
    config = LoadConfig(users=(row["users"],), workload=summary["workload"], seed=load.get("seed", 0),
                        requests_per_user=load["requests_per_user"], output_len=load.get("output_len"))
    batch = summary.get("engine_args", {}).get(row["engine"], {}).get("max_batch_size")
    return level_shape(planned_specs(config, row["users"]), row["users"], _static(row["engine"]), batch)


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


def planned_specs(load: LoadConfig, users: int) -> list:
    """The prompt and output lengths one count-bounded level sends (the run's own seeded lengths), in order."""
    return sample_specs(load.workload, users * load.requests_per_user, level_seed(load, users), load.output_len)


def planned_outputs(load: LoadConfig, users: int) -> list[int]:
    """The output lengths one count-bounded level sends, in sending order."""
    return [spec.output_len for spec in planned_specs(load, users)]


def level_shape(specs: list, users: int, static: bool, batch: int | None = None) -> LevelShape:
    """A level's prompt tokens prefilled, the prompt tokens one first token waits for, and its slowest chain of
    decode steps: a static batch of min(users, batch) pads its prompts to the longest and runs until its longest
    request; continuous batching prefills each prompt and hands each free user the next request."""
    outputs = [spec.output_len for spec in specs]
    if static:
        width = min(users, batch or users)
        chunks = [specs[i:i + width] for i in range(0, len(specs), width)]
        padded = [len(chunk) * max(spec.prompt_len for spec in chunk) for chunk in chunks]
        return LevelShape(sum(padded), sum(padded) / len(chunks), critical_path(outputs, users, True, batch)[1])
    prompts = [spec.prompt_len for spec in specs]
    wave = sum(prompts) / len(prompts) * min(users, len(prompts)) if prompts else 0.0
    return LevelShape(sum(prompts), wave, critical_path(outputs, users, False)[1])


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


def at_users(timings: list[LevelTiming], users: int) -> LevelTiming:
    """The timing at ``users``: interpolated in log users between the stored levels around it, or the nearest
    one outside them; each stored level the median of its newest MEDIAN_OF (one run on a shared machine can be
    several times slower than the next)."""
    by_users: dict[int, list[LevelTiming]] = {}
    for timing in timings:
        by_users.setdefault(timing.users, []).append(timing)
    lower = max((u for u in by_users if u <= users), default=None)
    upper = min((u for u in by_users if u >= users), default=None)
    low, high = (_median_timing(by_users[u][:MEDIAN_OF]) for u in (lower or upper, upper or lower))
    if low.users == high.users:
        return low
    w = math.log(users / low.users) / math.log(high.users / low.users)
    return LevelTiming(users, low.prefill_s + w * (high.prefill_s - low.prefill_s),
                       low.step_s + w * (high.step_s - low.step_s))


def _median_timing(timings: list[LevelTiming]) -> LevelTiming:
    return LevelTiming(timings[0].users, statistics.median(t.prefill_s for t in timings),
                       statistics.median(t.step_s for t in timings))


def level_seconds(plan: RunPlan, engine: str, users: int, timing: LevelTiming) -> float:
    """One level of one engine: its prompt tokens and critical path at the timing's speeds (a level bounded by
    time: its duration plus the tail of one longest request; open loop: at least its arrivals' span)."""
    load = plan.load
    if load.duration_s:
        spec = WORKLOADS[load.workload]
        return load.duration_s + spec.prompt_len[1] * timing.prefill_s + (
            load.output_len or spec.output_len[1]) * timing.step_s
    shape = level_shape(planned_specs(load, users), users, _static(engine), plan.engine.hf_max_batch_size)
    busy = shape.prefill * timing.prefill_s + shape.steps * timing.step_s
    return max(busy, users * load.requests_per_user / load.rate) if load.rate else busy


@dataclass(frozen=True)
class Estimate:
    """Seconds the run should take, how many stored runs it came from, and the engines only guessed."""

    seconds: float
    runs: int
    guessed: tuple[str, ...]


def estimate_run(plan: RunPlan, past: History, restarts: dict[str, float] | None = None) -> Estimate:
    """Warm-ups, levels (each repeat), pauses and settles, and the restarts of dead engines (their last start)."""
    load, engines = plan.load, plan.engines
    levels = sum(level_seconds(plan, e, u, at_users(past.timings(e), u)) for e in engines for u in load.users)
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
