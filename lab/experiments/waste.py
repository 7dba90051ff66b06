"""waste: how much KV memory each engine holds that holds no real token, the same workload on both.

HF's static batch reserves batch x (padded prompt + tokens so far) in one contiguous slab per batch;
vLLM holds whole blocks (its own used-block count x block size). Both are compared with the tokens the
requests really hold (prompt + output so far), in tokens and, with the model's bytes per token, in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.config import LoadConfig, RunPlan
from lab.engines.base import kv_bytes_per_token_formula
from lab.experiments import ended
from lab.metrics.kv import held_series, waste_stats

ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded


@dataclass(frozen=True)
class Params:
    """users: concurrent users; requests_per_user, workload, output_len (None: the workload's lengths)."""

    users: int = 8
    requests_per_user: int = 1
    workload: str = "mixed"
    output_len: int | None = None

    def load(self) -> LoadConfig:
        """The load config (it validates every value)."""
        return LoadConfig(users=(self.users,), workload=self.workload, requests_per_user=self.requests_per_user,
                          output_len=self.output_len, warmup_requests=1)

    def __post_init__(self) -> None:
        self.load()


def check(params: Params, config) -> None:
    """The workload's longest request must fit max_model_len (RunPlan's rule)."""
    RunPlan(engines=ENGINES, load=params.load(), engine=config)


async def run(session, params: Params, result, notify) -> None:
    """Run the workload on HF then vLLM; fill the waste figures of each."""
    await run_load(session, params, result, notify, "on HF, then vLLM")
    fill(session, result)


async def run_load(session, params: Params, result, notify, what: str) -> None:
    """The one load level both engines run (waste, blocks), kept in result.run for the live views."""
    plan = RunPlan(engines=ENGINES, load=params.load(), engine=session.config)
    result.run = session.new_result(plan)
    result.message = f"running {params.users} users of {params.workload!r} {what}"
    notify(result)
    ended(await session.run(plan, result=result.run))


def fill(session, result) -> None:
    """Waste per engine (peak and time-weighted), the bytes-per-token formula, series and CSV rows."""
    info = session.info
    per_token, formula = kv_bytes_per_token_formula(session.model_config, session.config.resolved_dtype())
    hf = _level(result.run, "hf")
    vllm = _level(result.run, "vllm")
    hf_series = held_series("hf", hf.samples, hf.records, per_token) if hf else []
    vllm_series = vllm.kv_held(info["vllm"]) if vllm else []
    result.fields = {
        "hf": {"waste_pct": _pct(waste_stats(hf_series)), "what": "batch x (padded prompt + steps)"},
        "vllm": {"waste_pct": _pct(waste_stats(vllm_series)), "block_size": info["vllm"].kv_block_size,
                 "what": "used blocks x block size"},
        "bytes_per_token": per_token, "bytes_per_token_formula": formula,
    }
    origin = result.run.origin_s
    result.series = {"hf": [(t - origin, held, real) for t, held, real in hf_series],
                     "vllm": [(t - origin, held, real) for t, held, real, *_ in vllm_series]}
    result.rows = [{"engine": name, "time_s": round(t, 4), "held_tokens": held, "real_tokens": real}
                   for name, rows in result.series.items() for t, held, real in rows]


def _level(run, engine: str):
    return next((lvl for lvl in run.levels if lvl.engine == engine), None)


def _pct(stats: dict) -> dict:
    """Waste shares as percentages (None stays None)."""
    return {k: (round(100 * v, 2) if isinstance(v, float) else v) for k, v in stats.items()}
