"""How long a run will take here, from start to end, computed from what the stored runs of this device measured.

A run is its engines' warm-ups, its levels, the pauses between levels (vLLM's settle before another engine,
each level's start and stop) and, when an engine of the plan is dead, its restart first. Each part is counted from
the plan's own seeded lengths and priced at a cost per engine fitted to the stored runs of this device and model:

- a level prefills its prompt tokens and runs the decode steps of its slowest chain. A static batch of
  min(users, batch) pads its prompts to the longest and runs every row until its longest request; continuous
  batching prefills each prompt and hands each free user the next request;
- a prompt token costs the median over stored levels of a level's time to a first token over the prompt tokens a
  first token waits for;
- a decode step costs a fixed time, a time per request it runs and a time per KV token it attends to (a static
  batch: every row, padding and finished requests included). A step's price follows its batch and its context,
  not its user level: on a 2-core CPU, HF's step over 8 rows padded to 508 tokens took 0.140 s, over 3 rows of a
  7-token prompt 0.031 s. The three are fitted to the stored levels' decode time (duration less prefill) by least
  relative absolute error, none below zero: like a median, one run slowed by a neighbour moves the fit little;
- a warm-up is a level of its own few short requests plus what stored warm-ups took beyond theirs (the reset
  after it); a pause, what stored runs took beyond their warm-ups, levels and settles, per level.

Without a stored run of an engine, a built-in first guess stands in (measured once on a quiet 2-core CPU,
docs/results/cpu-estimates.md), scaled to this machine by a probe timed when the engines start: a few decode steps
of PROBE's requests on each engine (about a second in all on a 2-core CPU), read as a stored level is read (its time
per prompt token, its decode time) and set against what the first guess prices that level at. Another CPU, or
this one shared with other processes, is then priced at what it measured, not at the first guess's CPU; the text
says which.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import itertools
import json
import statistics
from dataclasses import dataclass, field, replace

from lab.config import LoadConfig, RunPlan, duration_words
from lab.engines import registry
from lab.engines.base import GenRequest
from lab.load.driver import run_users
from lab.load.workloads import WORKLOADS, RequestSpec, mean_request, passage_ids, sample_specs
from lab.metrics import machine, summarize
from lab.runs import SETTLE_S, level_seed, warmup_lengths
from lab.store import list_results, list_summaries

HISTORY_RUNS = 50  # the newest stored runs of this model and device fitted (older ones describe an older lab)
HISTORY_READ = 200  # the newest stored runs read to find them (other models' and devices' runs among them)
HISTORY_TASKS = 5  # the newest stored experiments or sweeps of the same settings an estimate is the median of
FIT_ROUNDS = 20  # reweighted least-squares rounds of the least-absolute-error fit (converged well before)
# The sets of a step's cost drivers (0 steps, 1 KV tokens, 2 requests) a fit may use, fewer first. Where fits tie
# (two stored levels fit any two drivers exactly) the earlier wins: steps and KV tokens, most of a step on a CPU.
SUBSETS = [keep for size in (1, 2, 3) for keep in itertools.combinations(range(3), size)]
FIRST_GUESS_NOTE = "a built-in first guess from a 2-core CPU (docs/results/cpu-estimates.md)"


@dataclass(frozen=True)
class LevelShape:
    """What a level asks of an engine: the prompt tokens it prefills (a static batch's padding too), the prompt
    tokens one first token waits for, the decode steps of its slowest chain, and summed over those steps the
    requests they run and the KV tokens they attend to."""

    prefill: int
    wave: float
    steps: int
    kv: int = 0
    rows: int = 0

    def work(self) -> tuple[int, int, int]:
        """The decode steps' three cost drivers: steps, KV tokens attended and requests run."""
        return self.steps, self.kv, self.rows


@dataclass(frozen=True)
class Cost:
    """One engine's prices here: seconds per prompt token, and a decode step's seconds (fixed, per KV token it
    attends to, per request it runs)."""

    prefill_s: float
    step_s: float
    kv_s: float = 0.0
    row_s: float = 0.0

    def decode(self, shape: LevelShape) -> float:
        """Seconds of the shape's decode steps."""
        return _dot(shape.work(), (self.step_s, self.kv_s, self.row_s))

    def seconds(self, shape: LevelShape) -> float:
        """Seconds of the shape's prefill and decode steps."""
        return shape.prefill * self.prefill_s + self.decode(shape)


@dataclass(frozen=True)
class StoredLevel:
    """One stored level: its shape, its seconds per prompt token (None without prompt tokens), its duration and
    its tokens' mean gap."""

    shape: LevelShape
    prefill_s: float | None
    duration_s: float
    tpot_s: float

    def decode_s(self, prefill_s: float) -> float:
        """Its duration less its prefill at ``prefill_s`` per token (if that leaves nothing, the first token's wait
        was not prefill alone: its tokens' mean gap per step instead)."""
        rest = self.duration_s - prefill_s * self.shape.prefill
        return rest if rest > 0 else self.tpot_s * self.shape.steps


# The first guess: what the Workshop demo alone taught `python -m bench.estimates` on a quiet 2-core AMD EPYC
# (docs/results/cpu-estimates.md); read only for an engine this device has no stored run of.
FIRST_GUESS = {
    "hf": Cost(prefill_s=0.00107, step_s=0.0275, kv_s=3.27e-5, row_s=0.0),
    "vllm": Cost(prefill_s=0.00069, step_s=0.0162, kv_s=0.0, row_s=0.0015),
}
FIRST_WARMUP_S = {"hf": -0.11, "vllm": -0.01}  # its warm-ups beyond their requests at its cost (below 0: short of)
FIRST_GAP_S = 0.006
# The start probe: 2 users, 96-token prompts, 16 output tokens each (exact lengths): a static batch and a continuous
# one of two rows, so a step's fixed time and its per-request time both show. The first guess prices it at 0.76 s in
# HF and 0.44 s in vLLM (a quarter to a third of it prefill): about a second, inside the 2 s of engine time.
PROBE = (2, 96, 16)


@dataclass(frozen=True)
class History:
    """The costs fitted to the stored runs of one device and model, their warm-ups' extra time, and the pause per
    level."""

    costs: dict[str, Cost] = field(default_factory=dict)
    warmups: dict[str, float] = field(default_factory=dict)
    gap_s: float | None = None
    runs: int = 0
    probed: dict[str, Cost] = field(default_factory=dict)  # the first guess scaled by each engine's start probe
    probe_s: float = 0.0  # the probes' seconds (measured)
    probe_others: float | None = None  # where other processes disturbed a probe: the most cores they used (measured)
    cores: int | None = None  # the machine's cores, as the probes read them

    def cost(self, engine: str) -> Cost:
        """The engine's fitted cost, else its first guess scaled by its probe, else the first guess (an endpoint
        with none: vLLM's guess)."""
        return self.costs.get(engine) or self.probed.get(engine) or _guess(engine)

    def warmup_extra(self, engine: str) -> float:
        """What the engine's warm-up takes beyond its requests (stored, else the first guess)."""
        return self.warmups.get(engine, FIRST_WARMUP_S.get(engine, FIRST_WARMUP_S["vllm"]))

    def guessed(self, engines) -> list[str]:
        """The engines of ``engines`` that no stored run measured."""
        return [engine for engine in engines if engine not in self.costs]


def stored_history(db_path, model: str, device_name: str, probes: dict[str, dict] | None = None) -> History:
    """The costs fitted to the database's stored runs of this model and device, the engines without one priced by
    their start probe (``probes``: LabSession.probes): what the page's estimate line and a started run's estimate
    both read."""
    return calibrated(history(list_summaries(db_path, HISTORY_READ), model, device_name), probes or {})


def _guess(engine: str) -> Cost:
    return FIRST_GUESS.get(engine) or FIRST_GUESS["vllm"]


# -- the start probe: the first guess priced on this machine ------------------------------------------------------
def probe_requests(tokenizer) -> list[GenRequest]:
    """PROBE's requests: each a different stretch of the built-in passage (no shared prefix to cache)."""
    users, prompt, output = PROBE
    source = passage_ids(tokenizer, prompt * (users + 1))
    return [GenRequest(f"probe-{i}", tuple(source[i * prompt:(i + 1) * prompt]), output, True) for i in range(users)]


async def probe(engine, tokenizer) -> dict | None:
    """Time PROBE on a started engine (one short request first, so that no first-call cost lands in it), then
    forget its cache and samples: the level's time to a first token, duration and time per output token, and what
    other processes took meanwhile (lab.metrics.machine), measured; None when a request failed."""
    await run_users(engine, iter([GenRequest("probe-warm", tuple(passage_ids(tokenizer, 8)[:8]), 2, True)]), 1)
    before = machine.sample()
    records = await run_users(engine, iter(probe_requests(tokenizer)), PROBE[0])
    shared = machine.between(before, machine.sample())
    await engine.reset()
    engine.drain_samples()
    found = summarize(records, engine.name, PROBE[0])
    if found.completed != PROBE[0]:
        return None
    return {"ttft_s": found.ttft_s.mean, "duration_s": found.duration_s, "tpot_s": found.tpot_s.mean,
            "machine": shared}


def probe_shape(engine: str) -> LevelShape:
    """PROBE's shape on ``engine``."""
    users, prompt, output = PROBE
    return level_shape([RequestSpec(prompt, output)] * users, users, _static(engine))


def scaled_guess(engine: str, found: dict) -> Cost:
    """The engine's first guess with its prefill price scaled by the probe's time per prompt token over the guess's,
    and its step's prices by the probe's decode time over what the guess prices it at."""
    guess, shape = _guess(engine), probe_shape(engine)
    level = StoredLevel(shape, found["ttft_s"] / shape.wave, found["duration_s"], found["tpot_s"])
    prefill = level.prefill_s / guess.prefill_s
    decode = level.decode_s(level.prefill_s) / guess.decode(shape)
    return Cost(guess.prefill_s * prefill, guess.step_s * decode, guess.kv_s * decode, guess.row_s * decode)


def calibrated(past: History, probes: dict[str, dict]) -> History:
    """``past`` with the engines it has no stored run of priced by their probe (the others keep their fit)."""
    found = {engine: p for engine, p in probes.items() if p and engine not in past.costs}
    busy = [p["machine"]["others_cores"] for p in found.values() if machine.disturbed(p.get("machine"))]
    return replace(past, probed={engine: scaled_guess(engine, p) for engine, p in found.items()},
                   probe_s=sum(p["duration_s"] for p in found.values()), probe_others=max(busy, default=None),
                   cores=next((p["machine"]["cores"] for p in found.values() if p.get("machine")), None))


def probes_of(health: dict[str, dict]) -> dict[str, dict]:
    """The start probes in the host's health (lab.app.health: each engine's ``probe``)."""
    return {name: h["probe"] for name, h in health.items() if h.get("probe")}


def history(summaries: list[dict], model: str, device_name: str) -> History:
    """The costs fitted to the stored runs (summary.json dicts, newest first) of this device and model."""
    mine = [s for s in summaries if s.get("model") == model and s.get("device", {}).get("name") == device_name]
    mine = mine[:HISTORY_RUNS]
    levels: dict[str, list[StoredLevel]] = {}
    for summary in mine:
        for row in summary.get("runs", []):
            if (level := stored_level(summary, row)) is not None:
                levels.setdefault(row["engine"], []).append(level)
    costs = {engine: fit_cost(found) for engine, found in levels.items()}
    gaps = [g for s in mine if (g := gap_per_level(s)) is not None]
    return History(costs, warmup_extras(mine, costs), statistics.median(gaps) if gaps else None, len(mine))


def warmup_extras(summaries: list[dict], costs: dict[str, Cost]) -> dict[str, float]:
    """Per engine, the median of what stored warm-ups took beyond their requests at the fitted cost."""
    found: dict[str, list[float]] = {}
    for summary in summaries:
        for engine, seconds in (summary.get("warmup_s") or {}).items():
            if engine in costs and (shape := warmup_shape(summary, engine)) is not None:
                found.setdefault(engine, []).append(seconds - costs[engine].seconds(shape))
    return {engine: statistics.median(values) for engine, values in found.items()}


def warmup_shape(summary: dict, engine: str) -> LevelShape | None:
    """The shape of a stored run's warm-up (None when its workload is unknown here)."""
    load = summary.get("load", {})
    if summary.get("workload") not in WORKLOADS:
        return None
    config = LoadConfig(users=(1,), workload=summary["workload"], seed=load.get("seed", 0),
                        output_len=load.get("output_len"), warmup_requests=load.get("warmup_requests", 0))
    batch = summary.get("engine_args", {}).get(engine, {}).get("max_batch_size")
    return warmup_level(config, engine, batch)


def warmup_level(load: LoadConfig, engine: str, batch: int | None) -> LevelShape:
    """The warm-up's shape: its few short requests sent at once (lab.runs.warmup_requests)."""
    count, seed, output_len = warmup_lengths(load)
    if not count:
        return LevelShape(0, 0.0, 0)
    return level_shape(sample_specs(load.workload, count, seed, output_len), count, _static(engine), batch)


def stored_level(summary: dict, row: dict) -> StoredLevel | None:
    """A stored level's shape (rebuilt from the stored seed and lengths), its time per prompt token (its mean time
    to a first token over the prompt tokens a first token waits for) and its times; None when it finished nothing
    or cannot be rebuilt (bounded by time, open loop)."""
    first, shape = row["ttft_s"].get("mean"), stored_shape(summary, row)
    if not row.get("completed") or first is None or row.get("status") not in (None, "ok") or not shape:
        return None
    prefill = first / shape.wave if shape.wave else None
    return StoredLevel(shape, prefill, row["duration_s"], row["tpot_s"].get("mean") or 0.0)


def stored_shape(summary: dict, row: dict) -> LevelShape | None:
    """The shape of a stored count-bounded closed-loop level with decode steps (None for others)."""
    load = summary.get("load", {})
    if not load.get("requests_per_user") or load.get("rate") or summary.get("workload") not in WORKLOADS:
        return None
    config = LoadConfig(users=(row["users"],), workload=summary["workload"], seed=load.get("seed", 0),
                        requests_per_user=load["requests_per_user"], output_len=load.get("output_len"))
    args = summary.get("engine_args", {}).get(row["engine"], {})
    batch = args.get("max_batch_size") if _static(row["engine"]) else args.get("max_num_seqs")
    shape = level_shape(planned_specs(config, row["users"]), row["users"], _static(row["engine"]), batch)
    return shape if shape.steps else None


def fit_cost(levels: list[StoredLevel]) -> Cost:
    """The engine's cost from its stored levels: the median time per prompt token, and the decode step's three
    prices that fit the levels' durations less that prefill with the least relative absolute error, none below
    zero (the best fit over each subset of the three: the constrained best is one of them)."""
    prefills = [level.prefill_s for level in levels if level.prefill_s is not None]
    prefill = statistics.median(prefills) if prefills else 0.0
    timed = [(level.shape.work(), seconds) for level in levels if (seconds := level.decode_s(prefill)) > 0]
    work, seconds = [w for w, _ in timed], [s for _, s in timed]
    fits = [(*fit, order) for order, keep in enumerate(SUBSETS) if timed and (fit := fit_prices(work, seconds, keep))]
    return Cost(prefill, *(min(fits)[2] if fits else (0.0, 0.0, 0.0)))


def fit_prices(work: list[tuple], seconds: list[float], keep: tuple[int, ...]) -> tuple | None:
    """(relative absolute error, prices kept, the three prices) of the least-relative-absolute-error fit of
    ``seconds`` by the drivers of ``work`` in ``keep`` (reweighted least squares); None if one comes out below
    zero or the drivers cannot tell the prices apart."""
    rows = [[row[i] for i in keep] for row in work]
    weights = [1.0 / s ** 2 for s in seconds]  # relative least squares first, then toward least absolute error
    for _ in range(FIT_ROUNDS):
        if (prices := weighted_least_squares(rows, seconds, weights)) is None:
            return None
        errors = [abs(_dot(prices, row) - s) / s for row, s in zip(rows, seconds, strict=True)]
        weights = [1.0 / (s * s * max(e, 1e-4)) for s, e in zip(seconds, errors, strict=True)]
    if min(prices) < 0:
        return None
    full = [0.0, 0.0, 0.0]
    for i, price in zip(keep, prices, strict=True):
        full[i] = price
    return round(sum(errors), 9), len(keep), tuple(full)


def _dot(xs, ys) -> float:
    return sum(x * y for x, y in zip(xs, ys, strict=True))


def weighted_least_squares(rows: list[list[float]], ys: list[float], weights: list[float]) -> list[float] | None:
    """The x minimizing sum w (row . x - y)^2 (its normal equations, columns scaled to one); None if singular."""
    n = len(rows[0])
    scale = [max(abs(row[j]) for row in rows) or 1.0 for j in range(n)]
    a = [[sum(w * r[i] * r[j] / (scale[i] * scale[j]) for r, w in zip(rows, weights, strict=True)) for j in range(n)]
         + [sum(w * r[i] * y / scale[i] for r, y, w in zip(rows, ys, weights, strict=True))] for i in range(n)]
    solved = solve(a)
    return None if solved is None else [x / s for x, s in zip(solved, scale, strict=True)]


def solve(a: list[list[float]]) -> list[float] | None:
    """Gauss-Jordan on the augmented matrix ``a`` (n x n+1) with partial pivoting; None if (nearly) singular."""
    n, size = len(a), max(abs(a[i][i]) for i in range(len(a))) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9 * size:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


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
    """A level's prompt tokens prefilled, the prompt tokens one first token waits for, its slowest chain of decode
    steps, and the requests run and KV tokens attended over those steps: a static batch of min(users, batch) pads
    its prompts to the longest and runs every row until its longest request; continuous batching of min(users,
    batch) at once (``batch``: HF's max batch size, vLLM's max_num_seqs) prefills each prompt and runs each request
    for its own tokens."""
    width = min(users, batch or users)
    if static:
        return _sum_shapes([_batch_shape(specs[i:i + width]) for i in range(0, len(specs), width)])
    outputs = [spec.output_len for spec in specs]
    prompts = [spec.prompt_len for spec in specs]
    wave = sum(prompts) / len(prompts) * min(width, len(prompts)) if prompts else 0.0
    kv = sum(_attended(spec.prompt_len, spec.output_len) for spec in specs)
    return LevelShape(sum(prompts), wave, critical_path(outputs, width, False)[1], kv, sum(outputs))


def _batch_shape(chunk: list) -> LevelShape:
    """One static batch: every row padded to its longest prompt and run until its longest request."""
    padded, steps = max(spec.prompt_len for spec in chunk), max(spec.output_len for spec in chunk)
    rows = len(chunk)
    return LevelShape(rows * padded, rows * padded, steps, rows * _attended(padded, steps), rows * steps)


def _sum_shapes(shapes: list[LevelShape]) -> LevelShape:
    """Batches one after another: their counts add; a first token waits for one batch's prompts on average."""
    prefill = sum(shape.prefill for shape in shapes)
    return LevelShape(prefill, prefill / len(shapes) if shapes else 0.0, sum(shape.steps for shape in shapes),
                      sum(shape.kv for shape in shapes), sum(shape.rows for shape in shapes))


def _attended(prompt: int, steps: int) -> int:
    """The KV tokens one request's decode steps attend to: its prompt and the tokens made so far, each step."""
    return steps * prompt + steps * (steps + 1) // 2


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


def level_seconds(plan: RunPlan, engine: str, users: int, cost: Cost) -> float:
    """One level of one engine at its cost (a level bounded by time: its duration plus the tail of one longest
    request among ``users`` mean ones; open loop: at least its arrivals' span)."""
    load, static = plan.load, _static(engine)
    batch = plan.engine.hf_max_batch_size if static else plan.engine.max_num_seqs
    if load.duration_s:
        return load.duration_s + _tail_seconds(load, users, cost)
    busy = cost.seconds(level_shape(planned_specs(load, users), users, static, batch))
    return max(busy, users * load.requests_per_user / load.rate) if load.rate else busy


def _tail_seconds(load: LoadConfig, users: int, cost: Cost) -> float:
    """One longest request, prefilled and decoded beside users - 1 mean ones."""
    spec = WORKLOADS[load.workload]
    prompt, output = spec.prompt_len[1], load.output_len or spec.output_len[1]
    mean_prompt, mean_output = mean_request(load.workload, load.output_len)
    kv = _attended(prompt, output) + (users - 1) * output * (mean_prompt + mean_output / 2)
    return cost.seconds(LevelShape(prompt, prompt, output, int(kv), users * output))


@dataclass(frozen=True)
class Estimate:
    """Seconds the run should take, how many stored runs it came from, and the engines only guessed."""

    seconds: float
    runs: int
    guessed: tuple[str, ...]


def estimate_run(plan: RunPlan, past: History, restarts: dict[str, float] | None = None) -> Estimate:
    """Warm-ups, levels (each repeat), pauses and settles, and the restarts of dead engines (their last start)."""
    load, engines = plan.load, plan.engines
    levels = sum(level_seconds(plan, e, u, past.cost(e)) for e in engines for u in load.users)
    order = [e for _ in range(len(load.users) * load.repeats) for e in engines]
    warmups = sum(warmup_seconds(plan, e, past) for e in engines) if load.warmup_requests else 0.0
    gaps = len(order) * (FIRST_GAP_S if past.gap_s is None else past.gap_s) + settle_count(order) * SETTLE_S
    total = levels * load.repeats + warmups + gaps
    return Estimate(total + sum((restarts or {}).values()), past.runs, tuple(past.guessed(engines)))


def warmup_seconds(plan: RunPlan, engine: str, past: History) -> float:
    """The engine's warm-up: its requests at its cost, plus what stored warm-ups took beyond theirs."""
    shape = warmup_level(plan.load, engine, plan.engine.hf_max_batch_size)
    return max(0.0, past.cost(engine).seconds(shape) + past.warmup_extra(engine))


def estimate_text(plan: RunPlan, past: History, device_name: str, restarts: dict[str, float] | None = None) -> str:
    """One line for the page under the form: the estimate and what it was computed from (``past``: history())."""
    estimate = estimate_run(plan, past, restarts)
    restart = f", restarting {_names(restarts)} first" if restarts else ""
    if estimate.guessed:
        source = (f"{_guess_words(estimate.guessed, past)} for {_names(estimate.guessed)}: no finished run of "
                  f"{'it' if len(estimate.guessed) == 1 else 'them'} is stored for {device_name} yet")
    else:
        source = f"the {estimate.runs} stored run{'s' if estimate.runs != 1 else ''} of {device_name}"
    return (f"Estimated time: about {duration_words(estimate.seconds)}{restart} (computed from {source}; "
            "warm-up and pauses included).")


def _names(engines) -> str:
    """Engines as the page names them: 'HF and vLLM'."""
    labels = [registry.label(engine) for engine in engines]
    return ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]


def _guess_words(guessed: tuple[str, ...], past: History) -> str:
    """Where a guessed engine's prices came from: the first guess, scaled by the start probe where one ran."""
    probed = [engine for engine in guessed if engine in past.probed]
    if not probed:
        return FIRST_GUESS_NOTE
    said = f"{FIRST_GUESS_NOTE}, scaled by a {past.probe_s:.1f} s probe of {_names(probed)} measured at start here"
    if past.probe_others is not None:
        said += (f" while other processes used up to {past.probe_others:.2f} of the {past.cores} cores (measured: "
                 "the estimate holds while they keep that up)")
    return said + ","


# -- experiments and sweeps: what the same settings took here before; a sweep without one, computed -------------
def task_seconds(data: dict) -> float | None:
    """A stored experiment's or sweep's seconds from its start to its end (to the second; None without an end)."""
    if not data.get("ended_at"):
        return None
    return (dt.datetime.fromisoformat(data["ended_at"]) - dt.datetime.fromisoformat(data["started_at"])).total_seconds()


def _device_name(data: dict) -> str | None:
    device = data.get("device")  # the memory experiment's fields hold its device's name in ``device``
    return device if isinstance(device, str) else (device or {}).get("name")


def settings_seconds(found: list[dict], settings: dict, model: str, device_name: str) -> list[float]:
    """The seconds of the finished (ok) stored tasks of ``found`` (newest first) of this model and device whose
    ``settings`` (their stored keys and values) are the same."""
    plain = json.loads(json.dumps(settings, default=str))  # as stored: tuples are lists
    return [seconds for data in found
            if data.get("status") == "ok" and data.get("model") == model and _device_name(data) == device_name
            and all(data.get(key) == value for key, value in plain.items()) and (seconds := task_seconds(data))]


def stored_task_text(found: list[dict], settings: dict, model: str, device_name: str, what: str) -> str | None:
    """'Estimated time: about 3 min (the median of the 2 stored ladders with these settings on ..., measured: ...)';
    None when none is stored."""
    seconds = settings_seconds(found, settings, model, device_name)[:HISTORY_TASKS]
    if not seconds:
        return None
    said = (f"the median of the {len(seconds)} stored {what} with these settings on {device_name}, measured: "
            f"{duration_words(min(seconds))} to {duration_words(max(seconds))}") if len(seconds) > 1 else (
        f"the stored {what.removesuffix('s')} with these settings on {device_name} took that, measured")
    return f"Estimated time: about {duration_words(statistics.median(seconds))} ({said})."


def experiment_estimate(db_path, name: str, params, model: str, device_name: str) -> str:
    """The line before an experiment's Run (the Why tab's ladder, a KV-cache experiment): what the stored ones
    with the same parameters took here, or that none is stored yet (with the last one of other parameters)."""
    found = list_results(db_path, "experiment", name)
    what = "ladders" if name == "why" else f"{name} experiments"
    settings = {"params": dataclasses.asdict(params)}
    return stored_task_text(found, settings, model, device_name, what) or _unstored(found, model, device_name, what)


def experiment_line(host, name: str, params_of) -> str:
    """experiment_estimate for a tab's form over a Host (lab.app.seam): ``params_of()`` builds the Params; '' while
    it raises ValueError (the message line under Run says why when Run is pressed)."""
    try:
        params = params_of()
    except ValueError:
        return ""
    return experiment_estimate(host.db_path, name, params, host.check.model, host.check.memory.device.name)


def _unstored(found: list[dict], model: str, device_name: str, what: str) -> str:
    others = settings_seconds(found, {}, model, device_name)
    last = (f" The last one here, with other settings, took {duration_words(others[0])} (measured)." if others
            else "")
    return (f"No estimate yet: none of the {what} with these settings has finished on {device_name}; this one's "
            f"time is stored for the next.{last}")


def sweep_estimate(db_path, plan, config, past: History, start_s: float | None, model: str, device_name: str) -> str:
    """The line before a sweep's Run: what stored sweeps of the same knob, values and load took here; without one,
    computed: a restart of the engine per value (and one to restore the session's setting) at its last start,
    measured, and each value's load run priced as the Load test's estimate (``past``). Raises ValueError on a bad
    value (lab.sweeps.SweepPlan.configs)."""
    settings = {"knob": plan.knob, "values": list(plan.values), "load": dataclasses.asdict(plan.load)}
    what = f"sweeps of {plan.knob}"
    stored = stored_task_text(list_results(db_path, "sweep", plan.knob), settings, model, device_name, what)
    if stored:
        return stored
    configs = plan.configs(config)
    restarts, label = len(configs) + (configs[-1] != config), registry.label(plan.engine)
    runs = sum(estimate_run(RunPlan(engines=(plan.engine,), load=plan.load, engine=c), past).seconds for c in configs)
    loads = ("each value's load priced as the Load test's estimate is, its batch cap counted; what else the knob "
             "does to a step's speed is not")
    if not start_s:
        return (f"Estimated time: about {duration_words(runs)} (computed: {loads}; its {restarts} restarts of {label} "
                "are not counted: no start of it is measured yet).")
    return (f"Estimated time: about {duration_words(restarts * start_s + runs)} (computed: {restarts} restarts of "
            f"{label} at {start_s:.0f} s each, its last start here (measured), and {loads}).")


def sweep_line(host, plan) -> str:
    """sweep_estimate for the Sweeps tab's form over a Host (lab.app.seam): the engine's last start and the start
    probes from its health. Raises ValueError on a bad value."""
    health, device = host.health(), host.check.memory.device.name
    past = stored_history(host.db_path, host.check.model, device, probes_of(health))
    start_s = (health.get(plan.engine) or {}).get("last_start_s")
    return sweep_estimate(host.db_path, plan, host.config, past, start_s, host.check.model, device)
