"""Sweeps: one engine knob over several values, the same seeded requests at each, one engine restart each.

A knob belongs to one engine (``KNOBS``); each value restarts only that engine (the other stays loaded)
with the knob changed, times the restart, runs the load plan on it and keeps one point: tok/s, TTFT and
TPOT p50, KV blocks (total, peak used) or HF's peak reserved KV. Every value is validated before the
first restart. A cancelled or failed sweep keeps its finished points; at the end the engine is restarted
with the session's own setting, so the session serves as before.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.experiments import ended
from lab.status import RunStatus

log = logging.getLogger(__name__)

KNOBS = {  # knob -> the engine it changes
    "max_num_seqs": "vllm",
    "block_size": "vllm",
    "kv_cache_gib": "vllm",
    "gpu_memory_utilization": "vllm",
    "hf_max_batch_size": "hf",
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
        """The engine config of every value (each validated: EngineConfig's rules and the block-size rule)."""
        configs = [base.with_overrides(**{self.knob: value}) for value in self.values]
        for config in configs:
            config.check_block_size()
            RunPlan(engines=(self.engine,), load=self.load, engine=config)  # lengths vs max_model_len
        return configs

    def check(self, base: EngineConfig) -> None:
        """Every rule, before any engine restarts.

        Raises:
            ValueError: unknown knob, no values, a knob the device does not have, or a bad value.
        """
        if self.knob not in KNOBS:
            raise ValueError(f"unknown knob {self.knob!r}; choose one of {', '.join(KNOBS)}")
        if not self.values:
            raise ValueError(f"{self.knob}: give at least one value")
        if self.knob == "gpu_memory_utilization" and base.resolved_device() != "cuda":
            raise ValueError("gpu_memory_utilization is a GPU knob; on CPU sweep kv_cache_gib")
        from lab.session import check_session

        for config in self.configs(base):
            check_session(config, (self.engine,))  # the memory plan of each value


def parse_values(knob: str, text: str) -> tuple:
    """'1,4,16' -> (1, 4, 16) (floats for the memory knobs), with the knob named in any error."""
    kind = float if knob in ("kv_cache_gib", "gpu_memory_utilization") else int
    try:
        return tuple(kind(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"{knob}: {text!r} is not a list of {'numbers' if kind is float else 'whole numbers'}") \
            from None


@dataclass
class SweepResult:
    """A sweep, live while it runs and kept (partial) when it fails or is cancelled."""

    plan: SweepPlan
    model: str
    sweep_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    status: RunStatus = RunStatus.RUNNING
    error: str = ""
    message: str = "starting"
    points: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """As sweep.json holds it."""
        return {"sweep_id": self.sweep_id, "started_at": self.started_at, "status": self.status, "error": self.error,
                "knob": self.plan.knob, "engine": self.plan.engine, "values": list(self.plan.values),
                "load": dataclasses.asdict(self.plan.load), "model": self.model, "points": self.points}


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
    plan.check(session.config)
    result = result or SweepResult(plan=plan, model=session.check.model)
    notify = on_update or (lambda r: None)
    try:
        for index, config in enumerate(plan.configs(session.config)):
            value = plan.values[index]
            result.message = (f"{plan.knob}={value}: restarting {plan.engine} "
                              f"({index + 1}/{len(plan.values)}; {len(plan.values) - index - 1} left after it)")
            notify(result)
            result.points.append(await measure_point(session, plan, config, value))
            notify(result)
        result.status, result.message = RunStatus.OK, "done"
    except asyncio.CancelledError:
        result.status, result.message = RunStatus.CANCELLED, "cancelled: finished values kept"
    except Exception as exc:
        log.exception("sweep failed")
        result.status, result.error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
        result.message = f"failed: {result.error} (finished values kept)"
    finally:
        await restore(session, plan.engine, result)
    notify(result)
    return result


async def restore(session, engine: str, result: SweepResult) -> None:
    """Restart the swept engine with the session's own setting (the session serves as before)."""
    result.message += f"; restoring {engine} with the session's setting"
    try:
        await session.restart_engine(engine, session.config)
    except Exception as exc:
        log.exception("restoring %s failed", engine)
        result.error = result.error or f"restoring {engine} failed: {exc}"


async def measure_point(session, plan: SweepPlan, config: EngineConfig, value) -> dict:
    """Restart the engine with ``config`` (timed), run the load on it, and summarise one point."""
    started = time.perf_counter()
    info = await session.restart_engine(plan.engine, config)
    restart_s = time.perf_counter() - started
    run_plan = RunPlan(engines=(plan.engine,), load=plan.load, engine=config)
    run = await session.run(run_plan)
    ended(run)  # a cancelled or failed run stops the sweep (its finished points are kept)
    levels = [lvl for lvl in run.levels if lvl.summary is not None]
    point = {"value": value, "restart_s": restart_s, "kv_total_blocks": info.kv_total_blocks,
             "kv_block_size": info.kv_block_size}
    for level in levels:
        s = level.summary
        point[f"output_tok_s@{s.users}"] = s.output_tok_s
        point[f"ttft_p50_s@{s.users}"] = s.ttft_s.p50
        point[f"tpot_p50_s@{s.users}"] = s.tpot_s.p50
        point[f"kv_peak_used_blocks@{s.users}"] = level.kv.get("peak_used_blocks")
        point[f"kv_peak_reserved_bytes@{s.users}"] = level.kv.get("peak_reserved_bytes")
    return point


def write_sweep(result: SweepResult, out_dir: str | Path) -> dict[str, Path]:
    """Write DIR/sweep.json and DIR/sweep.csv (one row per value)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "csv": out / "sweep.csv"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=2, default=str))
    columns = list(dict.fromkeys(k for p in result.points for k in p)) or ["value"]
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(result.points)
    return paths
