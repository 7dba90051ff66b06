"""A run: every chosen engine at every user level, with progress events and files at the end.

``execute`` drives started engines through a RunPlan, level by level (engines interleaved at each
user level, so the ratio fills in as it goes). It never loses data: a request that fails is a record,
a level that fails or is cancelled keeps the records it made, and the RunResult says how it ended.
Observers (console bar, UI, tests) get on_start / on_update / on_complete with the live RunResult.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lab.config import RunPlan
from lab.engines.base import Engine, EngineInfo, EngineSample, GenRequest
from lab.load.driver import RequestRecord, run_users
from lab.load.workloads import make_requests
from lab.metrics import LevelSummary, e2e_s, ratios_by_users, summarize, tpot_s, ttft_s
from lab.metrics.kv import kv_summary
from lab.status import RunStatus

log = logging.getLogger(__name__)

SETTLE_S = 1.5  # vLLM's CPU worker busy-spins ~1 s after its last request: let it stop first
RUNNING, OK, FAILED, CANCELLED = RunStatus.RUNNING, RunStatus.OK, RunStatus.FAILED, RunStatus.CANCELLED


@dataclass
class LevelResult:
    """One engine at one user level: its records, its samples, and how it ended."""

    engine: str
    users: int
    planned: int | None
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[EngineSample] = field(default_factory=list)
    status: RunStatus = RUNNING
    error: str = ""
    summary: LevelSummary | None = None
    kv: dict = field(default_factory=dict)
    sent: list[RequestRecord] = field(default_factory=list)  # every request sent, filling in live

    def in_flight(self) -> list[RequestRecord]:
        """Requests sent and not yet ended (their records grow as tokens arrive)."""
        return [r for r in self.sent if r.end_s is None]

    def finish(self, info: EngineInfo | None, status: RunStatus, error: str = "") -> None:
        """Close the level: compute its summary and KV figures."""
        self.status, self.error = status, error
        self.summary = summarize(self.records, self.engine, self.users)
        self.kv = kv_summary(
            self.samples,
            info.kv_total_blocks if info else None,
            info.kv_block_size if info else None,
        )


@dataclass
class RunResult:
    """A run, live while it goes and complete (or partial) at the end."""

    plan: RunPlan
    model: str
    model_path: str
    device: dict
    versions: dict
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    origin_s: float = field(default_factory=time.perf_counter)
    engine_info: dict[str, EngineInfo] = field(default_factory=dict)
    agreement: list[dict] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)
    status: RunStatus = RUNNING
    error: str = ""
    message: str = "starting"

    def summaries(self) -> list[LevelSummary]:
        """Summaries of the finished levels."""
        return [lvl.summary for lvl in self.levels if lvl.summary is not None]

    def ratio(self) -> dict[int, float]:
        """vLLM/HF output tok/s per user level measured so far."""
        return ratios_by_users(self.summaries())

    def current(self) -> LevelResult | None:
        """The level running now, if any."""
        return self.levels[-1] if self.levels and self.levels[-1].status == RUNNING else None


class Observer(Protocol):
    """Progress listener; the console bar and the UI are two of them."""

    def on_start(self, result: RunResult) -> None: ...

    def on_update(self, result: RunResult) -> None: ...

    def on_complete(self, result: RunResult) -> None: ...


def level_seed(load, users: int) -> int:
    """The seed of one user level's requests (the same for every engine)."""
    return load.seed * 1000 + users


def level_requests(tokenizer, plan: RunPlan, users: int) -> Iterator[GenRequest]:
    """The requests of one user level: identical for every engine (same seed, same ids)."""
    load = plan.load
    seed = level_seed(load, users)
    if load.requests_per_user is not None:
        yield from make_requests(tokenizer, load.workload, users * load.requests_per_user, seed,
                                 load.output_len, load.exact_lengths, prefix=f"u{users}")
        return
    chunk = 0
    while True:  # duration-bound: an endless, still repeatable stream
        yield from make_requests(tokenizer, load.workload, 64, seed + 7919 * chunk, load.output_len,
                                 load.exact_lengths, prefix=f"u{users}c{chunk}")
        chunk += 1


async def warm_up(engine: Engine, tokenizer, plan: RunPlan) -> None:
    """Send a few unmeasured requests, then forget their cache and samples."""
    count = plan.load.warmup_requests
    if count:
        requests = make_requests(tokenizer, plan.load.workload, count, plan.load.seed + 99,
                                 min(plan.load.output_len or 16, 16), True, prefix=f"warmup-{engine.name}")
        await run_users(engine, iter(requests), users=count)
    await engine.reset()
    engine.drain_samples()


def _notify(observers: Sequence[Observer], method: str, result: RunResult) -> None:
    for observer in observers:
        try:
            getattr(observer, method)(result)
        except Exception:
            log.exception("observer %r failed in %s", observer, method)


async def execute(plan: RunPlan, engines: dict[str, Engine], tokenizer, result: RunResult,
                  observers: Sequence[Observer] = ()) -> RunResult:
    """Drive the started engines through the plan, filling ``result`` as it goes.

    Args:
        plan: Engines, user levels and workload.
        engines: Started engines by name (at least those in the plan).
        tokenizer: The model's tokenizer, to build identical requests for every engine.
        result: The RunResult to fill (created by the caller so that it can watch it live).
        observers: Progress listeners.

    Returns:
        ``result``, with status ok, failed (error set) or cancelled; partial levels are kept.
    """
    _notify(observers, "on_start", result)
    warmed: set[str] = set()
    last_engine = None
    try:
        for users in plan.load.users:
            for name in plan.engines:
                engine = engines[name]
                if last_engine == "vllm" and name != "vllm":
                    await asyncio.sleep(SETTLE_S)
                if name not in warmed:
                    result.message = f"warming up {name}"
                    _notify(observers, "on_update", result)
                    await warm_up(engine, tokenizer, plan)
                    warmed.add(name)
                await run_level(plan, engine, tokenizer, users, result, observers)
                last_engine = name
        result.status, result.message = OK, "done"
    except asyncio.CancelledError:
        result.status, result.message = CANCELLED, "cancelled: partial results kept"
        await _abort(engines)
    except Exception as exc:
        log.exception("run failed")
        result.status, result.error = FAILED, f"{type(exc).__name__}: {exc}"
        result.message = f"failed: {result.error} (partial results kept)"
    finally:
        for level in result.levels:
            if level.status == RUNNING:
                level.finish(result.engine_info.get(level.engine),
                             CANCELLED if result.status == CANCELLED else FAILED, result.error)
        _notify(observers, "on_complete", result)
    return result


async def _abort(engines: dict[str, Engine]) -> None:
    for engine in engines.values():
        try:
            await engine.abort_all()
        except Exception:
            log.exception("abort failed for %s", engine.name)


async def run_level(plan: RunPlan, engine: Engine, tokenizer, users: int, result: RunResult,
                    observers: Sequence[Observer] = ()) -> LevelResult:
    """Run one engine at one user level, appending its LevelResult to ``result`` as it goes."""
    load = plan.load
    planned = users * load.requests_per_user if load.requests_per_user is not None else None
    level = LevelResult(engine=engine.name, users=users, planned=planned)
    result.levels.append(level)
    result.message = f"{engine.name} at {users} user{'s' if users > 1 else ''}"
    await engine.reset()
    engine.drain_samples()
    _notify(observers, "on_update", result)

    def on_record(record: RequestRecord) -> None:
        level.records.append(record)
        level.samples.extend(engine.drain_samples())
        _notify(observers, "on_update", result)

    sampler = asyncio.ensure_future(_collect_samples(engine, level, observers, result))
    try:
        await run_users(engine, level_requests(tokenizer, plan, users), users, load.duration_s, on_record,
                        level.sent.append)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        level.samples.extend(engine.drain_samples())
    level.finish(result.engine_info.get(engine.name), OK)
    _notify(observers, "on_update", result)
    return level


async def _collect_samples(engine: Engine, level: LevelResult, observers, result, every_s: float = 0.5):
    """Move engine samples into the level twice a second, so live views see KV usage between records."""
    while True:
        await asyncio.sleep(every_s)
        level.samples.extend(engine.drain_samples())
        _notify(observers, "on_update", result)


# -- files -------------------------------------------------------------------------------------

def summary_dict(result: RunResult) -> dict:
    """The run as summary.json holds it."""
    runs = []
    for level in result.levels:
        s = level.summary or summarize(level.records, level.engine, level.users)
        entry = {
            "engine": level.engine, "users": level.users, "status": level.status, "error": level.error,
            "requests": s.requests, "completed": s.completed, "errors": s.errors, "cancelled": s.cancelled,
            "duration_s": s.duration_s, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
            "output_tok_s": s.output_tok_s, "total_tok_s": s.total_tok_s, "req_s": s.req_s,
            "ttft_s": s.ttft_s.to_dict(), "tpot_s": s.tpot_s.to_dict(), "itl_s": s.itl_s.to_dict(),
            "e2e_s": s.e2e_s.to_dict(),
        }
        if level.kv:
            entry["kv"] = level.kv
        runs.append(entry)
    plan = result.plan
    return {
        "run_id": result.run_id, "started_at": result.started_at, "status": result.status,
        "error": result.error, "model": result.model, "model_path": result.model_path,
        "device": result.device, "versions": result.versions,
        "workload": plan.load.workload, "users": list(plan.load.users), "engines": list(plan.engines),
        "load": {
            "requests_per_user": plan.load.requests_per_user, "duration_s": plan.load.duration_s,
            "output_len": plan.load.output_len, "exact_lengths": plan.load.exact_lengths,
            "warmup_requests": plan.load.warmup_requests, "seed": plan.load.seed,
        },
        "engine_args": {name: info.args for name, info in result.engine_info.items()},
        "agreement": result.agreement,
        "runs": runs,
        "ratio": {str(users): value for users, value in result.ratio().items()},
    }


REQUEST_COLUMNS = ("engine", "users", "user_id", "request_id", "status", "error", "prompt_tokens",
                   "max_tokens", "output_tokens", "send_s", "first_token_s", "end_s", "ttft_s",
                   "tpot_s", "e2e_s")


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
                "tpot_s": tpot_s(r), "e2e_s": e2e_s(r),
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
    with requests.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS)
        writer.writeheader()
        writer.writerows(request_rows(result))
    return {"summary": summary, "requests": requests}
