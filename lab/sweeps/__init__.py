"""Sweeps: one engine knob over several values, the same seeded requests at each, one engine restart each.

A knob belongs to one engine (``KNOBS``, read from each engine's registry entry); each value restarts only that
engine (the other stays loaded) with the knob changed, times the restart, runs the load plan on it and keeps one
point: tok/s, TTFT and TPOT p50, KV blocks (total, peak used) or HF's peak reserved KV. Every value is validated
before the first restart. A cancelled or failed sweep keeps its finished points; at the end the engine is restarted
with the session's own setting, so the session serves as before.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from lab.config import EngineConfig, LoadConfig, RunPlan, decimal, parse_users, whole
from lab.engines import registry
from lab.environment import read_device, versions
from lab.experiments import ended
from lab.runs import RunResult
from lab.tasks import TaskResult, TaskSpec, supervise

log = logging.getLogger(__name__)

KNOBS = registry.View(registry.knobs)  # knob -> the engine it changes (each engine's registry entry lists its own)
ENGINE_ARGS = {"kv_cache_gib": "kv_cache_memory_bytes", "hf_max_batch_size": "max_batch_size"}  # else: the knob
MAX_VALUES = 8  # values per sweep: each one is an engine restart (~30 s on 2 cores) plus its load run
DEFAULT_VALUES = {  # (knob, device kind) -> values; small on CPU so a sweep takes minutes, the seeds' on a GPU
    ("max_num_seqs", "cpu"): "1,4,16", ("max_num_seqs", "cuda"): "1,4,16,64,256",
    ("block_size", "cpu"): "32,64,128", ("block_size", "cuda"): "16,32",
    ("kv_cache_gib", "any"): "0.25,0.5,1", ("gpu_memory_utilization", "cuda"): "0.3,0.5,0.7",
    ("hf_max_batch_size", "cpu"): "1,2,4", ("hf_max_batch_size", "cuda"): "4,8,16,32",
}


@dataclass(frozen=True)
class SweepPlan:
    """A knob, its values, and the load each value runs (the same seeded requests every time)."""

    knob: str
    values: tuple
    load: LoadConfig = field(default_factory=lambda: LoadConfig(users=(5,), requests_per_user=2))

    @property
    def engine(self) -> str:
        return KNOBS[self.knob]

    def configs(self, base: EngineConfig) -> list[EngineConfig]:
        """The engine config of every value (each validated: EngineConfig's rules and the block-size rule);
        a value the base already runs keeps the base itself (so ending on it needs no restore)."""
        configs = [base if value == current_value(base, self.knob) else base.with_overrides(**{self.knob: value})
                   for value in self.values]
        for config in configs:
            config.check_block_size()
            RunPlan(engines=(self.engine,), load=self.load, engine=config)  # lengths vs max_model_len
        return configs

    def check(self, base: EngineConfig, held_bytes: int = 0) -> None:
        """Every rule, before any engine restarts; ``held_bytes``: what the swept engine holds now, if it is
        loaded (each restart frees it before the new engine starts, so the memory plan counts it as free).

        Raises:
            ValueError: unknown knob, no values, a knob the device does not have, or a bad value.
        """
        check_knob(self.knob)
        if not self.values:
            raise ValueError(f"{self.knob}: give at least one value")
        if self.knob == "gpu_memory_utilization" and base.resolved_device() != "cuda":
            raise ValueError("gpu_memory_utilization is a GPU knob; on CPU sweep kv_cache_gib")
        from lab.session import check_session

        for config in self.configs(base):
            check_session(config, (self.engine,), held_bytes)  # the memory plan of each value


def current_value(config: EngineConfig, knob: str):
    """The value an engine started with ``config`` runs (block_size None: the device's default)."""
    return config.resolved_block_size() if knob == "block_size" else getattr(config, knob)


def check_knob(knob: str) -> None:
    """Raises ValueError naming the knobs when ``knob`` is not one of them."""
    if knob not in KNOBS:
        raise ValueError(f"unknown knob {knob!r}; choose one of {', '.join(KNOBS)}")


def default_values(knob: str, device: str) -> str:
    """The values a sweep of ``knob`` starts from on this device kind ('cpu' or 'cuda'), as text."""
    return DEFAULT_VALUES.get((knob, device), DEFAULT_VALUES.get((knob, "any"), ""))


def sweep_plan(knob: str, values: str, users: str = "5", workload: str = "mixed", requests_per_user: int = 2,
               output_len: int | None = None, repeats: int = 1) -> SweepPlan:
    """A SweepPlan from text (CLI flags, the Sweeps tab's form); 0 or None output_len keeps the workload's; with
    repeats, each value's load runs that many times (a point holds the medians and tok/s's spread).

    Raises:
        ValueError: an unknown knob, values that are not numbers, or a bad load (before anything restarts).
    """
    out = None if output_len is None else whole(output_len, "output length (0 = the workload's)", low=0) or None
    load = LoadConfig(users=parse_users(users), workload=workload, warmup_requests=1, output_len=out,
                      requests_per_user=whole(requests_per_user, "requests per user", low=1), repeats=repeats)
    return SweepPlan(knob, parse_values(knob, values), load)


def parse_values(knob: str, text: str) -> tuple:
    """'1,4,16' -> (1, 4, 16) (floats for the memory knobs), with the knob named in any error; each value is
    checked by EngineConfig's own rule for the knob (e.g. hf_max_batch_size at most MAX_BATCH)."""
    check_knob(knob)
    memory = knob in ("kv_cache_gib", "gpu_memory_utilization")
    rule, kind = (decimal, "numbers") if memory else (whole, "whole numbers")
    try:
        values = tuple(rule(v, knob) for v in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"{knob}: {text!r} is not a list of {kind}") from None
    if not values:
        raise ValueError(f"{knob}: give at least one value, e.g. {default_values(knob, 'cpu') or '1,2'}")
    if len(values) > MAX_VALUES:
        raise ValueError(f"{knob}: {len(values)} values, past the limit of {MAX_VALUES} (each restarts the engine, "
                         f"about half a minute on a 2-core CPU, before its load runs): sweep fewer values")
    for value in values:
        EngineConfig(**{knob: value})
    return values


@dataclass(kw_only=True)
class SweepResult(TaskResult):
    """A sweep, live while it runs and kept (partial) when it fails or is cancelled."""

    KIND: ClassVar[str] = "sweep"
    KEPT: ClassVar[str] = "finished values kept"
    STORED_AS_IT_GOES: ClassVar[bool] = True  # each finished value is kept at once (an engine restart per value)

    plan: SweepPlan
    points: list[dict] = field(default_factory=list)
    run: RunResult | None = None  # the load run of the value being measured, for live views

    def name(self) -> str:
        """The swept knob."""
        return self.plan.knob

    def to_dict(self) -> dict:
        """As sweep.json holds it."""
        return {"sweep_id": self.id, "started_at": self.started_at, "ended_at": self.ended_at,
                "status": self.status, "error": self.error,
                "knob": self.plan.knob, "engine": self.plan.engine, "values": list(self.plan.values),
                "load": dataclasses.asdict(self.plan.load), "model": self.model, "device": self.device,
                "versions": self.versions, "points": self.points}


def new_sweep(session, plan: SweepPlan) -> SweepResult:
    """An empty result stamped with the session's model, device and versions."""
    return SweepResult(plan=plan, model=session.check.model, device=read_device(session.check.device).to_dict(),
                       versions=versions())


def sweep_progress(result: SweepResult | None) -> str:
    """One line: the knob, the status, which value runs and what is left, and each finished value's restart."""
    if result is None:
        return "No sweep yet: choose a knob and its values and press **Run sweep**."
    done = ", ".join(f"{p['value']} (restart {p['restart_s']:.0f} s)" for p in result.points) or "none yet"
    return (f"Sweep **{result.plan.knob}** ({result.id}): status {result.status}: {result.message}. "
            f"Finished values: {done}.")


async def run_sweep(session, plan: SweepPlan, result: SweepResult | None = None, on_update=None) -> SweepResult:
    """Sweep the knob on a started session; restores the engine's own setting at the end.

    Args:
        session: A started LabSession holding the knob's engine.
        plan: Knob, values and load.
        result: The result to fill (to watch it live), else a new one.
        on_update: Called with the result whenever it changed.

    Returns:
        The result: ok, failed (error set) or cancelled, with every finished point.
    """
    result = result or new_sweep(session, plan)
    notify = on_update or (lambda r: None)
    await supervise(result, _values(session, plan, result, notify))
    await restore(session, plan.engine, result)
    notify(result)
    return result


async def _values(session, plan: SweepPlan, result: SweepResult, notify) -> None:
    """Every value in turn: restart the engine with it, measure, keep the point."""
    plan.check(session.config, session.held_bytes(plan.engine))
    for index, config in enumerate(plan.configs(session.config)):
        value, left = plan.values[index], len(plan.values) - index - 1
        where = f"{plan.knob}={value} ({index + 1}/{len(plan.values)}; {left} left after it)"
        result.message = f"{where}: restarting {plan.engine}"
        notify(result)
        result.points.append(await measure_point(session, plan, config, result, where))
        notify(result)


async def restore(session, engine: str, result: SweepResult) -> None:
    """Restart the swept engine with the session's own setting (the session serves as before), unless the
    last value was that setting."""
    if session.configs.get(engine) == session.config:
        return
    done = result.message
    result.message = f"{done}; restoring {engine} with the session's setting"
    try:
        await session.restart_engine(engine, session.config)
        result.message = f"{done}; {engine} restored with the session's setting"
    except asyncio.CancelledError:  # a second cancel: the restart itself still finished (restart_engine)
        result.message = f"{done}; {engine} restored with the session's setting (a second cancel came meanwhile)"
    except Exception as exc:
        log.exception("restoring %s failed", engine)
        result.error = result.error or f"restoring {engine} failed: {exc}"


async def measure_point(session, plan: SweepPlan, config: EngineConfig, result: SweepResult, where: str) -> dict:
    """Restart the engine with ``config`` (timed), run the load on it, and summarise one point."""
    started = time.perf_counter()
    info = await session.restart_engine(plan.engine, config)
    restart_s = time.perf_counter() - started
    run_plan = RunPlan(engines=(plan.engine,), load=plan.load, engine=config)
    result.run = session.new_result(run_plan)
    result.message = f"{where}: measuring (the restart took {restart_s:.0f} s)"
    run = await session.run(run_plan, result=result.run)
    ended(run)  # a cancelled or failed run stops the sweep (its finished points are kept)
    levels = [lvl for lvl in run.levels if lvl.summary is not None]
    arg = ENGINE_ARGS.get(plan.knob, plan.knob)
    point = {"value": current_value(config, plan.knob), "engine_arg": f"{arg}={info.args.get(arg)}",
             "restart_s": restart_s, "kv_total_blocks": info.kv_total_blocks, "kv_block_size": info.kv_block_size}
    for users in dict.fromkeys(lvl.summary.users for lvl in levels):
        point.update(_level_figures([lvl for lvl in levels if lvl.summary.users == users], users, plan.engine))
    return point


def _level_figures(levels: list, users: int, engine: str) -> dict:
    """One user level of a point: the median over its repeats of tok/s, TTFT and TPOT p50, the peak KV, vLLM's
    preemptions over the repeats, and with several repeats tok/s's spread."""
    def median(values) -> float | None:
        found = [v for v in values if v is not None]
        return statistics.median(found) if found else None

    tok_s = [lvl.summary.output_tok_s for lvl in levels]
    figures = {f"output_tok_s@{users}": median(tok_s),
               f"ttft_p50_s@{users}": median(lvl.summary.ttft_s.p50 for lvl in levels),
               f"tpot_p50_s@{users}": median(lvl.summary.tpot_s.p50 for lvl in levels)}
    pool = registry.spec(engine).kv_pool  # vLLM's blocks and preemptions, else HF's reserved bytes
    key, field = (("kv_peak_used_blocks", "peak_used_blocks") if pool else
                  ("kv_peak_reserved_bytes", "peak_reserved_bytes"))
    figures[f"{key}@{users}"] = max((v for lvl in levels if (v := lvl.kv.get(field)) is not None), default=None)
    if pool:
        counted = [n for lvl in levels if (n := lvl.kv.get("preemptions")) is not None]
        figures[f"preemptions@{users}"] = sum(counted) if counted else None  # None: vLLM's counter never read
    if len(levels) > 1:
        figures[f"output_tok_s_spread@{users}"] = {"low": min(tok_s), "high": max(tok_s), "n": len(tok_s)}
    return figures


def write_sweep(result: SweepResult | dict, out_dir: str | Path) -> dict[str, Path]:
    """Write DIR/sweep.json and DIR/sweep.csv (one row per value), from a result or a stored sweep.json dict."""
    data = result if isinstance(result, dict) else result.to_dict()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "csv": out / "sweep.csv"}
    paths["json"].write_text(json.dumps(data, indent=2, default=str))
    columns = list(dict.fromkeys(k for p in data["points"] for k in p)) or ["value"]
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(data["points"])
    return paths


def _check(plan: SweepPlan, config: EngineConfig, session) -> None:
    plan.check(config, session.held_bytes(plan.engine) if session else 0)


TASK = TaskSpec(kind="sweep", plan=SweepPlan, check=_check,
                new=new_sweep, run=run_sweep, write=write_sweep, engines=lambda plan, config: (plan.engine,),
                started=lambda result: (f"Sweep of {result.plan.knob} ({result.id}) started: one "
                                        f"{registry.label(result.plan.engine)} restart per value."),
                cancelling=("Cancelling the sweep: it stops once the engine restart in progress (if any) has finished, "
                            "keeps its finished values and restores the session's setting."))
