"""Pure loaders behind the dashboard: turn user input into plans and runs into what the page shows.

No gradio here: lab/ui.py only lays out components and wires these functions to events, and the
notebooks can call them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.config import EngineConfig, LoadConfig, RunPlan, parse_users
from lab.environment import GIB
from lab.load.workloads import WORKLOADS
from lab.plots import (
    hf_kv_figure, latency_table, queue_figure, ratio_bars, throughput_figure, tok_s_bars, vllm_kv_figure,
)
from lab.runs import RUNNING, RunResult, summary_dict

BOUND_REQUESTS, BOUND_SECONDS = "requests per user", "seconds per level"


def plan_from_inputs(config: EngineConfig, engines: list[str] | None, users_text: str, workload: str,
                     output_len: float | None, bound: str, amount: float | None) -> RunPlan:
    """A validated RunPlan from the Load-test form.

    Args:
        config: The loaded engines' config (for max_model_len).
        engines: Ticked engines.
        users_text: e.g. '1,5,10,20'.
        workload: A workload name.
        output_len: Forced output length; 0 or empty keeps the workload's lengths.
        bound: BOUND_REQUESTS or BOUND_SECONDS.
        amount: Requests per user, or seconds per level.

    Returns:
        The plan.

    Raises:
        ValueError: with a message for the page.
    """
    if not engines:
        raise ValueError("Choose at least one engine (HF, vLLM).")
    users = parse_users(users_text or "")
    out = int(output_len) if output_len else None
    if out is not None and out < 0:
        raise ValueError(f"Output length must be positive, not {out}.")
    if workload not in WORKLOADS:
        raise ValueError(f"Unknown workload {workload!r}.")
    longest_prompt = WORKLOADS[workload].prompt_len[1] or 16
    if out is not None and out + longest_prompt > config.max_model_len:
        raise ValueError(
            f"Output length {out} tokens plus the workload's longest prompt ({longest_prompt} tokens) "
            f"does not fit max_model_len {config.max_model_len}: use at most {config.max_model_len - longest_prompt}."
        )
    if amount is None or amount <= 0:
        raise ValueError(f"{bound.capitalize()} must be positive.")
    load = LoadConfig(
        users=users, workload=workload, output_len=out,
        requests_per_user=int(amount) if bound == BOUND_REQUESTS else None,
        duration_s=float(amount) if bound == BOUND_SECONDS else None,
    )
    return RunPlan(engines=tuple(engines), load=load, engine=config)


def progress_text(result: RunResult | None) -> str:
    """One line: which engine and level is running and how many requests are done."""
    if result is None:
        return "No run yet: choose a workload and press Run."
    current = result.current()
    total_done = sum(len(lvl.records) for lvl in result.levels)
    if result.status == RUNNING and current is not None:
        planned = f"/{current.planned}" if current.planned else ""
        return (f"Running {result.run_id}: **{current.engine}** at **{current.users}** users, "
                f"{len(current.records)}{planned} requests done in this level ({total_done} in the run).")
    if result.status == RUNNING:
        return f"Running {result.run_id}: {result.message}"
    return f"Run {result.run_id} {result.message} ({total_done} requests measured)."


@dataclass(frozen=True)
class LiveView:
    """Everything the Load-test tab draws for one run."""

    progress: str
    throughput: Any
    tok_s_bars: Any
    ratio: Any
    vllm_kv: Any
    hf_kv: Any
    queue: Any
    latency: Any


def live_view(result: RunResult) -> LiveView:
    """Figures and table of a live or finished run (the same functions the notebooks use)."""
    summary = summary_dict(result)
    return LiveView(
        progress=progress_text(result), throughput=throughput_figure(result), tok_s_bars=tok_s_bars(summary),
        ratio=ratio_bars(summary), vllm_kv=vllm_kv_figure(result), hf_kv=hf_kv_figure(result),
        queue=queue_figure(result), latency=latency_table(summary),
    )


def environment_markdown(env: dict) -> str:
    """The Environment tab as readable text (the raw dict is shown beside it)."""
    device = env["device"]
    lines = [
        f"**Device:** {device['name']} ({device['kind']}), {device['total_bytes'] / GIB:.1f} GiB total, "
        f"{device['free_bytes'] / GIB:.1f} GiB free (read via {device['source']}), {device['cores']} CPU cores",
        f"**Model:** {env['model']['name']} — {(env['model']['weights_bytes'] or 0) / 2**20:.0f} MiB of weights "
        f"at `{env['model']['location']}`",
        "**Versions:** " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
    ]
    for name, engine in env["engines"].items():
        held = engine["memory_bytes"]
        held_text = f"{held / 2**20:.0f} MiB" if held else "?"
        what = "weights" if name == "hf" else "KV-cache budget"
        line = f"**{name}:** {engine['attention']}; holds {held_text} of {what}"
        if engine["kv_total_blocks"]:
            line += (f"; KV at start-up: {engine['kv_total_blocks']} blocks x {engine['kv_block_size']} tokens "
                     f"({engine['kv_total_blocks'] * engine['kv_block_size']:,} token slots)")
        lines.append(line)
    for proc in device.get("extra", {}).get("processes", []):
        lines.append(f"**GPU memory, pid {proc['pid']}** ({proc['role']}): {proc['used_bytes'] / GIB:.2f} GiB (NVML)")
    if env.get("process_rss_bytes"):
        lines.append(f"**This process (HF model, UI, vLLM client):** {env['process_rss_bytes'] / 2**20:.0f} MiB resident")
    for note in env["memory_plan"]["notes"]:
        lines.append(f"- {note}")
    lines.append(f"**Status:** {env['load_status']}")
    return "\n\n".join(lines)
