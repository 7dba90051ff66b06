"""blocks: vLLM's KV pool as a grid of blocks, each coloured by the request that owns it, beside HF's slab.

The grid is DERIVED (the page says so): each request in flight holds ceil(tokens / block_size) blocks,
its prompt plus the output tokens that reached the lab so far, laid out in sending order (vLLM's physical
block ids are not exposed). The experiment checks the derived count against vLLM's own used blocks
(kv_cache_usage x total) at every engine step: they must agree within one block per running request
(a request being computed holds the slot of the token it is making).
"""

from __future__ import annotations

from lab.experiments import waste
from lab.experiments.waste import LoadParams as Params
from lab.experiments.waste import run_load
from lab.load.driver import RequestRecord
from lab.metrics.kv import blocks_held, vllm_usage_series

ENGINES = waste.ENGINES  # the same load on both engines as the waste experiment, with its Params and rules
check = waste.check


async def run(session, params: Params, result, notify) -> None:
    """Run the workload on HF then vLLM (the live views draw both); then check the derived grid."""
    await run_load(session, params, result, notify, "on HF, then vLLM: watch the blocks")
    fill(session, result)


def fill(session, result) -> None:
    """Compare derived and vLLM-counted blocks at every vLLM sample."""
    info = session.info["vllm"]
    level = next(lvl for lvl in result.run.levels if lvl.engine == "vllm")
    series = [row for row in vllm_usage_series(level.samples, level.records) if row[5] or row[3]]
    origin = result.run.origin_s
    result.rows = [{"time_s": round(t - origin, 4), "vllm_used_blocks": used, "derived_blocks": derived,
                    "running": running, "within_tolerance": abs(derived - used) <= max(1, running)}
                   for t, _, _, used, derived, running in series]
    worst = max(result.rows, key=lambda r: abs(r["derived_blocks"] - r["vllm_used_blocks"]), default=None)
    result.fields = {
        "num_blocks": info.kv_total_blocks, "block_size": info.kv_block_size, "samples": len(result.rows),
        "agree": all(r["within_tolerance"] for r in result.rows) if result.rows else None,
        "max_abs_diff_blocks": abs(worst["derived_blocks"] - worst["vllm_used_blocks"]) if worst else None,
        "peak_used_blocks": max((r["vllm_used_blocks"] for r in result.rows), default=0),
        "vllm_ahead": worst["vllm_used_blocks"] > worst["derived_blocks"] if worst else None,  # at the widest gap
    }
    result.series = {"check": [(r["time_s"], r["vllm_used_blocks"], r["derived_blocks"]) for r in result.rows]}


def derive_grid(records: list[RequestRecord], time_s: float, block_size: int, num_blocks: int) -> list[str | None]:
    """Owner of each block at ``time_s`` (request id or None for free), requests in sending order.

    Args:
        records: The level's requests (in flight or not; only those holding tokens at time_s count).
        time_s: perf_counter time of the picture.
        block_size: Tokens per block.
        num_blocks: Blocks in vLLM's pool.

    Returns:
        num_blocks cells; more derived blocks than the pool holds are cut off.
    """
    cells: list[str | None] = []
    for record in sorted(records, key=lambda r: r.send_s):
        cells += [record.request_id] * blocks_held(record, time_s, block_size)
    return (cells + [None] * num_blocks)[:num_blocks]
