"""waste: how much KV memory each engine holds that holds no real token, the same workload on each, by kind.

HF's static batch holds batch x (padded prompt + tokens so far) in one contiguous slab per batch; HF with a
static cache (``hf-static``) reserves every row for the load's longest request up front, as a server that cannot
know an answer's length must; vLLM holds whole blocks (its own used-block count x block size). Each is compared
with the tokens running requests really hold (prompt + output so far), in tokens and, with the model's bytes per
token, in bytes; the rest is split into the vLLM paper's three kinds of waste: reservation (slots a request will
fill later), internal fragmentation (slots inside a request's allocation it never fills) and external
fragmentation (memory reserved outside any request's allocation).
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.config import LoadConfig, RunPlan
from lab.engines.base import kv_bytes_per_token_formula
from lab.experiments import ended
from lab.load.workloads import longest_request
from lab.metrics.kv import held_series, kinds_series, kinds_shares, waste_stats

ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded
STATIC = "hf-static"  # HF with a static cache, started by the experiment itself
PAPER = {"orca": (20.4, 38.2), "vllm": 96.3}  # published: % of KV memory holding token states (vLLM paper, Fig. 2)
WHAT = {"hf": "batch x (padded prompt + steps)", STATIC: "rows x the load's longest request, reserved up front",
        "vllm": "used blocks x block size"}


@dataclass(frozen=True)
class LoadParams:
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


@dataclass(frozen=True)
class Params(LoadParams):
    """users: concurrent users; requests_per_user, workload, output_len (None: the workload's lengths); static:
    also run HF with a static cache that reserves every row for the load's longest request (reservation waste)."""

    static: bool = True


def check(params: LoadParams, config) -> None:
    """The workload's longest request must fit max_model_len (RunPlan's rule)."""
    RunPlan(engines=ENGINES, load=params.load(), engine=config)


def static_config(config, params: Params):
    """HF with a static cache (hf_compile; compiled on CUDA only) whose every row reserves the load's longest
    request, prompt + answer, up front, its batches as wide as the users: a batch that gathers fewer requests
    keeps the rest of its rows reserved."""
    longest = sum(longest_request(params.workload, params.output_len))
    return config.with_overrides(hf_compile=True, hf_max_batch_size=params.users, max_model_len=longest)


async def run(session, params: Params, result, notify) -> None:
    """Run the workload on HF then vLLM, then (static) on HF with a static cache; fill the waste of each."""
    await run_load(session, params, result, notify, "on HF, then vLLM")
    fill(session, result)
    if params.static:
        await run_static(session, params, result, notify)


async def run_load(session, params: LoadParams, result, notify, what: str) -> None:
    """The one load level both engines run (waste, blocks), kept in result.run for the live views."""
    plan = RunPlan(engines=ENGINES, load=params.load(), engine=session.config)
    result.run = session.new_result(plan)
    result.message = f"running {params.users} users of {params.workload!r} {what}"
    notify(result)
    ended(await session.run(plan, result=result.run))


async def run_static(session, params: Params, result, notify) -> None:
    """The same requests on an HF engine with a static cache, started here and stopped after; its run is the live
    view while it goes, then the HF and vLLM run is result.run again."""
    from lab.engines import create_engine
    from lab.runs import execute

    config = static_config(session.config, params)
    engine, main = create_engine("hf", config, session.check.model_path), result.run
    result.message = f"starting HF with a static cache of {config.max_model_len} tokens a row"
    notify(result)
    try:
        info = await engine.start()
        plan = RunPlan(engines=("hf",), load=params.load(), engine=config)
        result.run = session.new_result(plan)
        result.run.engine_info = {"hf": info}
        result.message = f"running {params.users} users of {params.workload!r} on HF with a static cache"
        notify(result)
        ended(await execute(plan, {"hf": engine}, session.tokenizer, result.run))
        _add(result, STATIC, _level(result.run, "hf"), info.kv_bytes_per_token, result.run.origin_s)
        result.fields[STATIC]["cache_tokens_per_row"] = config.max_model_len
    finally:
        result.run = main
        await engine.stop()


def fill(session, result) -> None:
    """Waste per engine (peak, time-weighted, by kind), the bytes-per-token formula, series and CSV rows."""
    per_token, formula = kv_bytes_per_token_formula(session.model_config, session.config.resolved_dtype())
    result.fields.update(bytes_per_token=per_token, bytes_per_token_formula=formula)
    for name in ENGINES:
        level = _level(result.run, name)
        if level is not None:
            _add(result, name, level, per_token, result.run.origin_s)
    if "vllm" in result.fields:
        result.fields["vllm"]["block_size"] = session.info["vllm"].kv_block_size
        sizes = [r.prompt_tokens + r.output_tokens for r in _level(result.run, "vllm").records if r.output_tokens]
        result.fields["tokens_per_request"] = {"min": min(sizes), "max": max(sizes)} if sizes else None


def _add(result, name: str, level, per_token: int, origin: float) -> None:
    """One engine's level: its waste, its kinds, its series and rows."""
    engine = "vllm" if name == "vllm" else "hf"
    held = held_series(engine, level.samples, level.records, per_token)
    kinds = kinds_series(engine, level.samples, level.records, per_token)
    result.fields[name] = {"waste_pct": _pct(waste_stats(held)), "kinds_pct": _pct(kinds_shares(kinds)),
                           "what": WHAT[name]}
    result.series[name] = [(t - origin, held_tokens, real) for t, held_tokens, real, *_ in held]
    result.rows += [{"engine": name, "time_s": round(t, 4), "held_tokens": held_tokens, "real_tokens": real}
                    for t, held_tokens, real in result.series[name]]


def _level(run, engine: str):
    return next((lvl for lvl in run.levels if lvl.engine == engine), None)


def _pct(stats: dict) -> dict:
    """Waste shares as percentages (None stays None)."""
    return {k: (round(100 * v, 2) if isinstance(v, float) else v) for k, v in stats.items()}
