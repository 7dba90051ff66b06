"""waste: how much KV memory each engine holds that holds no real token, the same workload on each, by kind.

HF's static batch holds batch x (padded prompt + tokens so far) in one contiguous slab per batch; HF with a
static cache (``hf-static``) reserves every row for the load's longest request up front, as a server that cannot
know an answer's length must; vLLM holds whole blocks (its own used-block count x block size). Each is compared
with the tokens running requests really hold (prompt + output so far), in tokens and, with the model's bytes per
token, in bytes; the rest is split into the vLLM paper's three kinds of waste: reservation (slots a request will
fill later), internal fragmentation (slots inside a request's allocation it never fills) and external
fragmentation (memory reserved outside any request's allocation).

vLLM's waste depends on its block size: a request's last block is partly empty. ``block_sizes`` runs the same
requests on vLLM at other block sizes too (each on a vLLM started here), and the paper's 16 is computed from the
session's run where it was not run: each request's measured tokens cut into blocks of 16. Each size's row says
what a running request held on average and so how many such requests the same pool holds at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.config import LoadConfig, RunPlan
from lab.engines.base import kv_bytes_per_token_formula
from lab.experiments import ended
from lab.load.workloads import longest_request
from lab.metrics.kv import (
    blocks_for,
    held_series,
    kinds_series,
    kinds_shares,
    tokens_held,
    used_blocks,
    vllm_usage_series,
    waste_stats,
)

ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded
STATIC = "hf-static"  # HF with a static cache, started by the experiment itself
PAPER_BLOCK = 16  # the vLLM paper's block size (and vLLM's CUDA default), computed where it was not run
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
    block_sizes: tuple[int, ...] = ()  # vLLM block sizes to run the same requests at too, each on a vLLM of its own


def check(params: LoadParams, config) -> None:
    """The workload's longest request must fit max_model_len (RunPlan's rule); each block size must be one vLLM
    takes on this device (EngineConfig's rule)."""
    RunPlan(engines=ENGINES, load=params.load(), engine=config)
    for size in getattr(params, "block_sizes", ()):  # the blocks experiment's params have none
        config.with_overrides(block_size=size).check_block_size()


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
    for size in params.block_sizes:
        await run_block_size(session, params, result, notify, size)


async def run_load(session, params: LoadParams, result, notify, what: str) -> None:
    """The one load level both engines run (waste, blocks), kept in result.run for the live views."""
    plan = RunPlan(engines=ENGINES, load=params.load(), engine=session.config)
    result.run = session.new_result(plan)
    result.message = f"running {params.users} users of {params.workload!r} {what}"
    notify(result)
    ended(await session.run(plan, result=result.run))


async def run_static(session, params: Params, result, notify) -> None:
    """The same requests on an HF engine with a static cache, started here and stopped after."""
    config = static_config(session.config, params)
    run, info = await run_own(session, params, result, notify, "hf", config,
                              f"HF with a static cache of {config.max_model_len} tokens a row")
    _add(result, STATIC, _level(run, "hf"), info.kv_bytes_per_token, run.origin_s)
    result.fields[STATIC]["cache_tokens_per_row"] = config.max_model_len


async def run_block_size(session, params: Params, result, notify, size: int) -> None:
    """The same requests on a vLLM whose blocks hold ``size`` tokens, started here and stopped after: its row."""
    config = session.config.with_overrides(block_size=size)
    run, info = await run_own(session, params, result, notify, "vllm", config, f"vLLM with blocks of {size} tokens")
    result.fields.setdefault("block_sizes", {})[str(size)] = measured_row(_level(run, "vllm"), info.kv_block_size,
                                                           info.kv_total_blocks)


async def run_own(session, params: LoadParams, result, notify, name: str, config, what: str):
    """Start engine ``name`` with ``config``, run the load on it alone (the live view while it goes), stop it;
    returns its run and its start-up info. result.run is the session's run again after."""
    from lab.engines import create_engine
    from lab.runs import execute

    engine, main = create_engine(name, config, session.check.model_path), result.run
    result.message = f"starting {what}"
    notify(result)
    try:
        info = await engine.start()
        plan = RunPlan(engines=(name,), load=params.load(), engine=config)
        result.run = session.new_result(plan)
        result.run.engine_info = {name: info}
        result.message = f"running {params.users} users of {params.workload!r} on {what}"
        notify(result)
        ended(await execute(plan, {name: engine}, session.tokenizer, result.run))
        return result.run, info
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
        info, level = session.info["vllm"], _level(result.run, "vllm")
        result.fields["vllm"]["block_size"] = info.kv_block_size
        sizes = [r.prompt_tokens + r.output_tokens for r in level.records if r.output_tokens]
        result.fields["tokens_per_request"] = {"min": min(sizes), "max": max(sizes)} if sizes else None
        result.fields["block_sizes"] = block_rows(level, info.kv_block_size, info.kv_total_blocks)


def block_rows(level, block_size: int, num_blocks: int | None) -> dict:
    """The session's vLLM row (measured) and, where it ran at another size, the paper's block size computed from
    the same requests in the same pool."""
    rows = {str(block_size): measured_row(level, block_size, num_blocks)}
    if block_size != PAPER_BLOCK and num_blocks:
        rows[str(PAPER_BLOCK)] = computed_row(level, PAPER_BLOCK, num_blocks * block_size)
    return rows


def measured_row(level, block_size: int, num_blocks: int | None) -> dict:
    """What vLLM's own blocks held at ``block_size`` (its used blocks at every step) for the requests holding tokens
    then (counted from their arrivals, as the computed rows count them)."""
    usage = vllm_usage_series(level.samples, level.records)
    counted = cut_into_blocks(level, block_size)
    rows = [(t, held, real, n) for (t, held, real, *_), (*_, n) in zip(usage, counted, strict=True)]
    pool = num_blocks * block_size if num_blocks else None
    return _row(rows, block_size, pool, "engine") | {"num_blocks": num_blocks, "peak_used_blocks": max(
        (used_blocks(s) or 0 for s in level.samples), default=0)}


def computed_row(level, block_size: int, pool_tokens: int) -> dict:
    """What blocks of ``block_size`` would have held for the same requests at the same steps: each request's
    measured tokens cut into whole blocks (computed)."""
    return _row(cut_into_blocks(level, block_size), block_size, pool_tokens, "formula")


def cut_into_blocks(level, block_size: int) -> list[tuple]:
    """(time, held, real, requests holding tokens) at every vLLM step, each request's tokens in whole blocks."""
    times = [s.time_s for s in level.samples if used_blocks(s) is not None and s.kv_block_size]
    rows = []
    for time_s, after in zip(times, times[1:] + [float("inf")], strict=True):
        tokens = [n for n in (tokens_held(r, after) for r in level.records) if n]
        rows.append((time_s, sum(blocks_for(n, block_size) * block_size for n in tokens), sum(tokens), len(tokens)))
    return rows


def _row(rows: list[tuple], block_size: int, pool_tokens: int | None, origin: str) -> dict:
    """A block size's waste, the KV slots a request holding tokens held on average (time-weighted: held over
    requests holding tokens, each row until the next) and how many such requests the pool holds at once."""
    held, running = _integral(rows, 1), _integral(rows, 3)
    per_request = held / running if running else None
    fits = int(pool_tokens // per_request) if pool_tokens and per_request else None
    return {"block_size": block_size, "origin": origin, "waste_pct": _pct(waste_stats(rows))["mean"],
            "held_per_request": round(per_request, 1) if per_request else None, "pool_tokens": pool_tokens,
            "requests_at_once": fits}


def _integral(rows: list[tuple], column: int) -> float:
    """A column of a (time, ...) series over time, each row holding until the next."""
    return sum(row[column] * (nxt[0] - row[0]) for row, nxt in zip(rows, rows[1:], strict=False))


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
