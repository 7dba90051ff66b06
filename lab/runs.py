"""A run: every chosen engine at every user level, with progress events and files at the end.

``execute`` drives started engines through a RunPlan, level by level (engines interleaved at each
user level, so the ratio fills in as it goes). It never loses data: a request that fails is a record,
a level that fails or is cancelled keeps the records it made, and the RunResult says how it ended.
Progress goes to one ``notify(result)`` (the channel every task kind shares, lab.tasks.TaskSpec): called as the
run starts, whenever it changed, and once it ended (``ended_at`` set).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from lab.config import RunPlan
from lab.engines import registry
from lab.engines.base import Engine, EngineFault, EngineInfo, EngineSample, GenRequest
from lab.load.arrivals import schedule_s
from lab.load.chat import chat_streams
from lab.load.driver import RequestRecord, run_open, run_users
from lab.load.workloads import make_requests
from lab.metrics import (
    LevelSummary,
    e2e_s,
    machine,
    queue_s,
    ratio_key,
    ratio_pairs,
    ratio_spreads,
    ratios_by_users,
    summarize,
    throughput_series,
    tok_s_spreads,
    tpot_s,
    ttft_s,
)
from lab.metrics.kv import held_series, kv_summary
from lab.metrics.steps import add_floors, all_factors, level_steps
from lab.metrics.turns import turn_rows
from lab.status import RunStatus
from lab.tasks import TaskResult, TaskSpec, nothing, supervise

log = logging.getLogger(__name__)
FINAL_AFTER_S = 0.5  # a live KV row is kept once the sample after it is this old (see LevelResult._held_live)

SETTLE_S = 1.5  # vLLM's CPU worker busy-spins ~1 s after its last request: let it stop first


@dataclass
class LevelResult:
    """One engine at one user level: its records, its samples, and how it ended."""

    engine: str
    users: int
    planned: int | None
    repeat: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[EngineSample] = field(default_factory=list)
    status: RunStatus = RunStatus.RUNNING
    error: str = ""
    summary: LevelSummary | None = None
    kv: dict = field(default_factory=dict)
    sent: list[RequestRecord] = field(default_factory=list)  # every request sent, filling in live
    kv_series: list[tuple] | None = None  # lab.metrics.kv.held_series, kept once the level has ended
    tok_s_series: list[tuple] | None = None  # lab.metrics.throughput_series, kept once the level has ended
    steps: dict | None = None  # lab.metrics.steps.level_steps, once the level has ended
    slo: tuple = ()  # the plan's latency targets (goodput)
    machine: dict | None = None  # lab.metrics.machine.between over the level: other processes' CPU, steal (measured)
    # held_series rows that no longer change and the first sample whose row may: one attribute, so that two
    # pages redrawing at once see a consistent pair
    _live: tuple[list, int] = field(default_factory=lambda: ([], 0), repr=False)
    copied_s: float | None = None  # a mirror's (lab.app.mirror): when its records were copied; None: they are live

    def in_flight(self) -> list[RequestRecord]:
        """Requests sent and not yet ended (their records grow as tokens arrive)."""
        return [r for r in self.sent if r.end_s is None]

    def finish(self, info: EngineInfo | None, status: RunStatus, error: str = "") -> None:
        """Close the level: compute its summary and KV figures."""
        self.status, self.error = status, error
        self.summary = summarize(self.records, self.engine, self.users, self.repeat, self.slo)
        self.kv = kv_summary(
            self.samples,
            info.kv_total_blocks if info else None,
            info.kv_block_size if info else None,
        )
        self.kv_series = self._held_now(info)
        self.tok_s_series = self.throughput()
        self.steps = level_steps(self.samples, info.kv_bytes_per_token if info else None)

    def kv_held(self, info: EngineInfo | None) -> list[tuple]:
        """The KV the engine held and the real tokens in it, over time (kept once the level has ended, and
        while it runs, computed only for the rows that may still change: the live page redraws it every
        second)."""
        return self.kv_series if self.kv_series is not None else self._held_live(info)

    def throughput(self) -> list[tuple]:
        """Output tok/s in each second since the level's first send (kept once the level has ended)."""
        if self.tok_s_series is not None:
            return self.tok_s_series
        return throughput_series(self.records, origin_s=min(r.send_s for r in self.records)) if self.records else []

    def _held_now(self, info: EngineInfo | None) -> list[tuple]:
        return held_series(self.engine, self.samples, self.records, info.kv_bytes_per_token if info else None)

    def _held_live(self, info: EngineInfo | None) -> list[tuple]:
        """held_series of the running level over every request sent (in flight too), computed only from the
        first sample whose row may still change. A row is final once the next sample is FINAL_AFTER_S old: its
        step's tokens, a new request's first token and a finished one's end have reached the records by then
        (a step's tokens reach them up to a flush later than the step, an end after its stream closes). "Old"
        counts to now, or in a mirror to when its records were copied."""
        kept, start = self._live
        fresh = self.samples[start:]
        since = fresh[0].time_s if fresh else 0.0
        holding = [r for r in self.sent if r.end_s is None or r.end_s >= since]
        rows = held_series(self.engine, fresh, holding, info.kv_bytes_per_token if info else None)
        if len(rows) != len(fresh):  # some samples made no row: no row is matched to its sample, none kept
            return kept + rows
        settled = (self.copied_s or time.perf_counter()) - FINAL_AFTER_S
        final = next((i for i, later in enumerate(fresh[1:]) if later.time_s >= settled), len(fresh) - 1)
        if final:
            self._live = (kept + rows[:final], start + final)
        return kept + rows


@dataclass(kw_only=True)
class RunResult(TaskResult):
    """A run, live while it goes and complete (or partial) at the end."""

    KIND: ClassVar[str] = "run"
    KEPT: ClassVar[str] = "partial results kept"

    plan: RunPlan
    model_path: str = ""
    origin_s: float = field(default_factory=time.perf_counter)
    engine_info: dict[str, EngineInfo] = field(default_factory=dict)
    agreement: list[dict] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)
    warmup_s: dict[str, float] = field(default_factory=dict)  # each engine's warm-up, measured
    ended_s: float | None = None  # perf_counter at the end: wall_s = ended_s - origin_s
    estimate_s: float | None = None  # the estimate (lab.estimate) the page showed for this plan when it started
    hardware: dict = field(default_factory=dict)  # the floor's inputs (lab.runs.hardware), once the run has ended

    def name(self) -> str:
        """The run's workload."""
        return self.plan.load.workload

    def checkpoint(self) -> tuple:
        """Stored as each level ends and as the run ends."""
        return sum(1 for lvl in self.levels if lvl.status != RunStatus.RUNNING), self.status

    def to_dict(self) -> dict:
        """As summary.json holds it."""
        return summary_dict(self)

    def summaries(self) -> list[LevelSummary]:
        """Summaries of the finished levels."""
        return [lvl.summary for lvl in self.levels if lvl.summary is not None]

    def ratio(self, base: str = "hf", top: str = "vllm") -> dict[int, float]:
        """``top`` / ``base`` output tok/s per user level measured so far."""
        return ratios_by_users([s.to_dict() for s in self.summaries()], base, top)

    def current(self) -> LevelResult | None:
        """The level running now, if any."""
        return self.levels[-1] if self.levels and self.levels[-1].status == RunStatus.RUNNING else None


Notify = Callable[[TaskResult], None]  # the progress channel: called with the live result


def level_seed(load, users: int) -> int:
    """The seed of one user level's requests (the same for every engine)."""
    return load.seed * 1000 + users


def level_requests(tokenizer, plan: RunPlan, users: int, repeat: int = 0) -> Iterator[GenRequest] | list:
    """The requests of one user level: identical for every engine and every repeat (same seed; the
    ids differ by repeat only). The chat workload: one stream of turns per user (lab.load.chat)."""
    load = plan.load
    seed, prefix = level_seed(load, users), f"u{users}" + (f"r{repeat}" if repeat else "")
    if load.workload == "chat":
        return chat_streams(tokenizer, users, load.requests_per_user, seed, plan.engine.max_model_len,
                            load.output_len, load.exact_lengths, prefix)
    return single_requests(tokenizer, plan, seed, prefix, users)


def single_requests(tokenizer, plan: RunPlan, seed: int, prefix: str, users: int) -> Iterator[GenRequest]:
    """A level's requests, one shared queue: users x requests per user, or an endless stream for a time bound."""
    load = plan.load
    if load.requests_per_user is not None:
        yield from make_requests(tokenizer, load.workload, users * load.requests_per_user, seed,
                                 load.output_len, load.exact_lengths, prefix=prefix)
        return
    chunk = 0
    while True:  # duration-bound: an endless, still repeatable stream
        yield from make_requests(tokenizer, load.workload, 64, seed + 7919 * chunk, load.output_len,
                                 load.exact_lengths, prefix=f"{prefix}c{chunk}")
        chunk += 1


def warmup_lengths(load) -> tuple[int, int, int]:
    """The warm-up's request count, seed and output length (at most 16 tokens), for its requests and the estimate."""
    return load.warmup_requests, load.seed + 99, min(load.output_len or 16, 16)


def warmup_requests(tokenizer, plan: RunPlan, name: str) -> list[GenRequest]:
    """The plan's unmeasured requests before a level: warmup_requests short ones (<= 16 tokens) of its workload."""
    count, seed, output_len = warmup_lengths(plan.load)
    if not count:
        return []
    return make_requests(tokenizer, plan.load.workload, count, seed, output_len, True, prefix=f"warmup-{name}")


async def warm_up(engine: Engine, tokenizer, plan: RunPlan) -> None:
    """Send a few unmeasured requests, then forget their cache and samples."""
    requests = warmup_requests(tokenizer, plan, engine.name)
    if requests:
        await run_users(engine, iter(requests), users=len(requests))
    await engine.reset()
    engine.drain_samples()


def tell(notify: Notify, result: TaskResult) -> None:
    """Call ``notify`` with the result; a listener that fails is logged, never stops the task."""
    try:
        notify(result)
    except Exception:
        log.exception("progress listener %r failed", notify)


async def execute(plan: RunPlan, engines: dict[str, Engine], tokenizer, result: RunResult,
                  notify: Notify = nothing) -> RunResult:
    """Drive the started engines through the plan, filling ``result`` as it goes.

    Args:
        plan: Engines, user levels and workload.
        engines: Started engines by name (at least those in the plan).
        tokenizer: The model's tokenizer, to build identical requests for every engine.
        result: The RunResult to fill (created by the caller so that it can watch it live).
        notify: The progress channel (as it starts, as it goes, once it ended).

    Returns:
        ``result``, with status ok, failed (error set) or cancelled; partial levels are kept.
    """
    result.engine_args = {name: info.args for name, info in result.engine_info.items()}
    tell(notify, result)
    return await supervise(result, _levels(plan, engines, tokenizer, result, notify),
                           lambda ended: _complete(ended, notify))


async def _levels(plan: RunPlan, engines: dict[str, Engine], tokenizer, result: RunResult, notify: Notify) -> None:
    """Every level of the plan in run order (a cancel aborts what the engines hold, then goes on up)."""
    warmed: set[str] = set()
    last_engine = None
    try:
        for users, repeat, name in level_order(plan):
            engine = engines[name]
            if last_engine and registry.spec(last_engine).kv_pool and name != last_engine:
                await asyncio.sleep(SETTLE_S)
            if not engine.alive():  # before anything is sent: a dead vLLM answers with a bare EngineDeadError
                raise EngineFault(f"{engine.fault()}, before the {users}-user level of {name}")
            if name not in warmed:
                result.message = f"warming up {name}"
                tell(notify, result)
                began = time.perf_counter()
                await warm_up(engine, tokenizer, plan)
                result.warmup_s[name] = time.perf_counter() - began
                warmed.add(name)
            await run_level(plan, engine, tokenizer, users, result, notify, repeat)
            last_engine = name
    except asyncio.CancelledError:
        await _abort(engines)
        raise


def _complete(result: RunResult, notify: Notify) -> None:
    """Close the levels a stop left open, then tell the listener the run ended."""
    result.ended_s = time.perf_counter()
    result.hardware = hardware(result)
    for level in result.levels:
        if level.status == RunStatus.RUNNING:
            level.finish(result.engine_info.get(level.engine),
                         RunStatus.CANCELLED if result.status == RunStatus.CANCELLED else RunStatus.FAILED,
                         result.error)
    tell(notify, result)


def hardware(result: RunResult) -> dict:
    """What a step's floor needs (lab.metrics.steps): the device's copy bandwidth, measured once per process now
    that the engines are idle, and the model's weight bytes, computed from its config; each missing one says why."""
    from lab.engines.bandwidth import measure
    from lab.memory import local_config
    from lab.model import shape_bytes

    engine = result.plan.engine
    found: dict = {"weight_bytes": shape_bytes(local_config(result.model_path), engine.resolved_dtype())}
    if found["weight_bytes"] is None:
        found["weight_bytes_missing"] = "no Llama-style config.json beside the model to compute its weights from"
    try:
        found["bandwidth"] = measure(engine.resolved_device())
    except Exception as exc:  # noqa: BLE001 - a floor not computed never fails the run
        found["bandwidth_missing"] = f"the copy probe failed ({type(exc).__name__}: {exc})"
    return found


def level_order(plan: RunPlan) -> Iterator[tuple[int, int, str]]:
    """(users, repeat, engine) in run order: each level's repeats in turn, engines interleaved in each."""
    for users in plan.load.users:
        for repeat in range(plan.load.repeats):
            for name in plan.engines:
                yield users, repeat, name


async def _abort(engines: dict[str, Engine]) -> None:
    for engine in engines.values():
        try:
            await engine.abort_all()
        except Exception:
            log.exception("abort failed for %s", engine.name)


async def run_level(plan: RunPlan, engine: Engine, tokenizer, users: int, result: RunResult,
                    notify: Notify = nothing, repeat: int = 0, requests: Iterable | None = None) -> LevelResult:
    """Run one engine at one user level, appending its LevelResult to ``result`` as it goes (on the plan's requests
    for the level, or on ``requests``: the Why ladder's, the same for every rung)."""
    load = plan.load
    planned = users * load.requests_per_user if load.requests_per_user is not None else None
    level = LevelResult(engine=engine.name, users=users, planned=planned, repeat=repeat, slo=load.slo)
    result.levels.append(level)
    result.message = f"{engine.name} at {users} user{'s' if users > 1 else ''}" + (
        f" (repeat {repeat + 1} of {load.repeats})" if load.repeats > 1 else "")
    info = result.engine_info.get(engine.name)
    await engine.reset()
    engine.drain_samples()
    tell(notify, result)

    def on_record(record: RequestRecord) -> None:
        level.records.append(record)
        level.samples.extend(engine.drain_samples())
        tell(notify, result)

    requests = level_requests(tokenizer, plan, users, repeat) if requests is None else iter(requests)
    before = machine.sample()
    if load.rate is None:
        driver = asyncio.ensure_future(run_users(engine, requests, users, load.duration_s, on_record,
                                                 level.sent.append, load.think_s))
    else:
        times = schedule_s(load.rate, load.arrival, load.burstiness, level_seed(load, users) + repeat)
        driver = asyncio.ensure_future(run_open(engine, requests, times, users, load.duration_s, on_record,
                                                level.sent.append))
    watcher = asyncio.ensure_future(_watch(engine, level, notify, result, driver))
    try:
        await driver
    except asyncio.CancelledError:
        if not level.error:  # the run was cancelled (not stopped by the watcher)
            raise
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        level.samples.extend(engine.drain_samples())
        level.machine = machine.between(before, machine.sample())
    fault = level.error or engine.fault()
    level.finish(info, RunStatus.FAILED if fault else RunStatus.OK, fault or "")
    tell(notify, result)
    if fault:
        raise EngineFault(f"{fault}, during the {_level_words(level)}")
    return level


def _level_words(level: LevelResult) -> str:
    return f"{level.users}-user level of {level.engine}"


async def _watch(engine: Engine, level: LevelResult, notify: Notify, result, driver: asyncio.Future,
                 every_s: float = 0.5) -> None:
    """Twice a second: move engine samples into the level (live views see KV usage between records), and
    stop the level's users once the engine has died or failed its work (``level.error`` says why)."""
    while True:
        await asyncio.sleep(every_s)
        level.samples.extend(engine.drain_samples())
        if (fault := engine.fault()) is not None:
            level.error = fault
            driver.cancel()
            return
        tell(notify, result)


# -- files -------------------------------------------------------------------------------------

def summary_dict(result: RunResult) -> dict:
    """The run as summary.json holds it."""
    runs = []
    for level in result.levels:
        s = level.summary or summarize(level.records, level.engine, level.users, level.repeat, level.slo)
        entry = {
            "engine": level.engine, "users": level.users, "repeat": level.repeat, "status": level.status,
            "error": level.error,
            "requests": s.requests, "completed": s.completed, "errors": s.errors, "cancelled": s.cancelled,
            "duration_s": s.duration_s, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
            "output_tok_s": s.output_tok_s, "total_tok_s": s.total_tok_s, "req_s": s.req_s,
            "ttft_s": s.ttft_s.to_dict(), "tpot_s": s.tpot_s.to_dict(), "itl_s": s.itl_s.to_dict(),
            "e2e_s": s.e2e_s.to_dict(),
        }
        if s.queue_s is not None:
            entry["queue_s"], entry["ttft_scheduled_s"] = s.queue_s.to_dict(), s.ttft_scheduled_s.to_dict()
        if s.goodput_req_s is not None:
            entry["goodput_req_s"], entry["slo_met"] = s.goodput_req_s, s.slo_met
        if level.kv:
            entry["kv"] = level.kv
        if level.machine:
            entry["machine"] = level.machine
        entry["steps"] = level.steps
        runs.append(entry)
    plan = result.plan
    return {
        "run_id": result.id, "started_at": result.started_at, "ended_at": result.ended_at, "status": result.status,
        "error": result.error, "model": result.model, "model_path": result.model_path,
        "device": result.device, "versions": result.versions,
        "workload": plan.load.workload, "users": list(plan.load.users), "engines": list(plan.engines),
        "load": {
            "requests_per_user": plan.load.requests_per_user, "duration_s": plan.load.duration_s,
            "output_len": plan.load.output_len, "exact_lengths": plan.load.exact_lengths,
            "warmup_requests": plan.load.warmup_requests, "seed": plan.load.seed, "repeats": plan.load.repeats,
            "rate": plan.load.rate, "arrival": plan.load.arrival, "burstiness": plan.load.burstiness,
            "slo": dict(plan.load.slo), "think_s": plan.load.think_s,
        },
        "endpoints": [e.public() for e in plan.engine.endpoints if e.name in plan.engines],
        "engine_args": {name: info.args for name, info in result.engine_info.items()},
        "agreement": result.agreement,
        "runs": runs,
        "ratio": {str(users): value for users, value in result.ratio().items()},
        "ratios": {ratio_key(top, base): {str(users): value for users, value in result.ratio(base, top).items()}
                   for top, base in ratio_pairs(plan.engines)},
        "spread": spread_dict(runs, ratio_pairs(plan.engines)),
        "factors": factors_dict(runs, plan.engines, result.hardware), "hardware": result.hardware,
        "warmup_s": dict(result.warmup_s), "wall_s": wall_s(result), "estimate_s": result.estimate_s,
        "turns": turn_rows([(level.engine, level.users, level.repeat, level.records) for level in result.levels]),
    }


def factors_dict(runs: list[dict], engines, found: dict) -> dict:
    """summary.json's ``factors``: the first ratio's identity per level (lab.metrics.steps), with each engine's
    floor where the hardware's figures are known."""
    pairs = ratio_pairs(engines)
    if not pairs:
        return {}
    factors = all_factors(runs, base=pairs[0][1], top=pairs[0][0])
    add_floors(factors, found.get("weight_bytes"), found.get("bandwidth", {}).get("bytes_per_s"))
    return factors


def wall_s(result: RunResult) -> float | None:
    """Seconds from the run's start (its submit) to its end, measured; None while it goes."""
    return None if result.ended_s is None else result.ended_s - result.origin_s


def spread_dict(runs: list[dict], pairs: list[tuple[str, str]]) -> dict:
    """summary.json's ``spread``: per engine and per user level, output tok/s over the repeats, and each
    ratio's (``ratio`` for vLLM / HF, ``ratio_hf_cb`` for vLLM / HF-CB, ``ratio_TOP/BASE`` for the others)."""
    spreads: dict[str, dict] = {}
    for (engine, users), found in tok_s_spreads(runs).items():
        spreads.setdefault(engine, {})[str(users)] = found.to_dict()
    spreads["ratio"] = {str(users): found.to_dict() for users, found in ratio_spreads(runs).items()}
    for top, base in pairs:
        if (top, base) != (registry.RATIO_TOP, registry.BASELINE):
            key = "ratio_" + ratio_key(top, base).replace("-", "_")
            spreads[key] = {str(u): found.to_dict() for u, found in ratio_spreads(runs, base, top).items()}
    return spreads


REQUEST_COLUMNS = ("engine", "users", "user_id", "request_id", "status", "error", "prompt_tokens",
                   "max_tokens", "output_tokens", "send_s", "first_token_s", "end_s", "ttft_s",
                   "tpot_s", "e2e_s", "scheduled_s", "queue_s", "turn", "cached_tokens")


def request_rows(result: RunResult) -> list[dict]:
    """One row per request; times are seconds from the run's start."""
    rows = []
    for level in result.levels:
        for r in level.records:
            def rel(t):
                return None if t is None else round(t - result.origin_s, 6)

            rows.append({
                "engine": r.engine, "users": r.users, "user_id": r.user_id, "request_id": r.request_id,
                "status": r.status, "error": r.error, "prompt_tokens": r.prompt_tokens,
                "max_tokens": r.max_tokens, "output_tokens": r.output_tokens, "send_s": rel(r.send_s),
                "first_token_s": rel(r.first_token_s), "end_s": rel(r.end_s), "ttft_s": ttft_s(r),
                "tpot_s": tpot_s(r), "e2e_s": e2e_s(r), "scheduled_s": rel(r.scheduled_s), "queue_s": queue_s(r),
                "turn": r.turn, "cached_tokens": r.cached_tokens,
            })
    return rows


def write_run(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Write summary.json and requests.csv (the files the CLI and the UI both offer).

    Args:
        result: A finished (or partial) run.
        out_dir: Folder to write into; created if missing.

    Returns:
        The written paths by name.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.json"
    summary.write_text(json.dumps(summary_dict(result), indent=2, default=str))
    requests = out / "requests.csv"
    requests.write_text(requests_csv_text(result))
    return {"summary": summary, "requests": requests}


def requests_csv_text(result: RunResult) -> str:
    """requests.csv as text: one row per request (request_rows), the file the CLI writes and the store keeps."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=REQUEST_COLUMNS)
    writer.writeheader()
    writer.writerows(request_rows(result))
    return buffer.getvalue()


def _run(session, plan: RunPlan, result: RunResult, notify: Notify) -> Awaitable[RunResult]:
    """The plan on the session's engines, each engine's info as it is now (a dead one may have restarted since)."""
    result.engine_info = {name: session.info[name] for name in plan.engines}
    return session.run(plan, notify, result)


def _fit_warning(plan: RunPlan, memory) -> str | None:
    from lab.memory import kv_fit_warning

    return kv_fit_warning(plan, memory)


TASK = TaskSpec(kind="run", plan=RunPlan, check=nothing, new=lambda session, plan: session.new_result(plan),
                run=_run, write=write_run, engines=lambda plan, config: plan.engines,
                started=lambda result: f"Run {result.id} started.", warning=_fit_warning, restarts_dead=True,
                predicts=lambda plan: "ratio")  # the room predicts a load test's ratio (lab.predictions.RATIO)
