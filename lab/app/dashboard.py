"""Pure loaders behind the dashboard: turn user input into plans and runs into what the page shows.

No gradio here: lab/app/ui.py only lays out components and wires these functions to events, and the
notebooks can call them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.config import (
    MAX_REPEATS,
    EngineConfig,
    LoadConfig,
    RunPlan,
    decimal,
    parse_slo,
    parse_users,
    whole,
)
from lab.engines import registry
from lab.environment import GIB
from lab.plots import (
    kv_tokens_figure,
    latency_table,
    queue_figure,
    ratio_bars,
    throughput_figure,
    tok_s_bars,
    vllm_kv_figure,
)
from lab.runs import RunResult, summary_dict
from lab.sentences import ratio_caption
from lab.status import RequestStatus, RunStatus

BOUND_REQUESTS, BOUND_SECONDS = "requests per user", "seconds per level"


def engine_choices(loaded) -> list[tuple[str, str]]:
    """The form's engine choices: (label, name) of each loaded engine, the registry's kinds in its order, then
    the endpoints (labelled by their own names)."""
    kinds = [name for name in registry.names() if name in loaded]
    return [(registry.label(name), name) for name in kinds + [n for n in loaded if n not in kinds]]


def plan_from_inputs(config: EngineConfig, engines: list[str] | None, users_text: str, workload: str,
                     output_len: float | None, bound: str, amount: float | None, repeats: float | None = 1,
                     rate: float | None = 0, slo: str = "") -> RunPlan:
    """A validated RunPlan from the Load-test form.

    Args:
        config: The loaded engines' config (for max_model_len).
        engines: Ticked engines.
        users_text: e.g. '1,5,10,20'.
        workload: A workload name.
        output_len: Forced output length; 0 keeps the workload's lengths (empty is refused: say 0).
        bound: BOUND_REQUESTS or BOUND_SECONDS.
        amount: Requests per user, or seconds per level.
        repeats: Times each level runs per engine (for the spread).
        rate: Open loop's requests per second (users cap what is in flight); 0: closed loop (empty is refused).
        slo: Latency targets for goodput, e.g. 'ttft=0.5,tpot=0.05'.

    Returns:
        The plan.

    Raises:
        ValueError: with a message for the page.
    """
    users = parse_users(users_text or "")
    out = whole(output_len, "Output length (0 = the workload's)", low=0) or None  # 0: the workload's own lengths
    if bound not in (BOUND_REQUESTS, BOUND_SECONDS):
        raise ValueError(f"Bound each level by: choose {BOUND_REQUESTS} or {BOUND_SECONDS}, not {bound!r}.")
    open_loop = decimal(rate, "Open loop: requests/s (0 = users)") or None  # 0: closed-loop users
    load = LoadConfig(
        users=users, workload=workload, output_len=out, repeats=whole(repeats, "Repeats", 1, MAX_REPEATS),
        requests_per_user=whole(amount, "Requests per user", low=1) if bound == BOUND_REQUESTS else None,
        duration_s=decimal(amount, "Seconds per level") if bound == BOUND_SECONDS else None,
        rate=open_loop, slo=parse_slo(slo or ""),
    )
    return RunPlan(engines=tuple(engines or ()), load=load, engine=config)


def progress_text(result: RunResult | None) -> str:
    """One line: which engine and level is running and how many requests are done."""
    if result is None:
        return "No run yet: once the line at the top says the engines are ready, choose a workload and press Run."
    current = result.current()
    total_done = sum(len(lvl.records) for lvl in result.levels)
    if result.status == RunStatus.RUNNING and current is not None:
        planned = f"/{current.planned}" if current.planned else ""
        return (f"Running {result.id}: **{current.engine}** at **{current.users}** "
                f"user{'s' if current.users > 1 else ''}, "
                f"{len(current.records)}{planned} requests done in this level ({total_done} in the run).")
    if result.status == RunStatus.RUNNING:
        return f"Running {result.id}: {result.message}"
    ended = [r.status for lvl in result.levels for r in lvl.records]
    finished = ended.count(RequestStatus.OK)
    parts = [f"{ended.count(status)} {words}" for status, words in
             ((RequestStatus.CANCELLED, "stopped by the cancel"), (RequestStatus.ERROR, "failed"))
             if ended.count(status)]
    return (f"Run {result.id} {result.message}: {finished} requests finished"
            + (f", {' and '.join(parts)} before their last token" if parts else "") + ".")


@dataclass(frozen=True)
class LiveView:
    """Everything the Load-test tab draws for one run."""

    progress: str
    throughput: Any
    tok_s_bars: Any
    ratio: Any
    vllm_kv: Any
    kv_tokens: Any
    queue: Any
    latency: Any
    caption: str = ""


def live_view(result: RunResult) -> LiveView:
    """Figures and table of a live or finished run (the same functions the notebooks use)."""
    progress, throughput, queue, vllm_kv, kv_tokens = over_time_view(result)
    bars, ratio, latency, caption = per_level_view(result)
    return LiveView(progress=progress, throughput=throughput, tok_s_bars=bars, ratio=ratio, vllm_kv=vllm_kv,
                    kv_tokens=kv_tokens, queue=queue, latency=latency, caption=caption)


def over_time_view(result: RunResult) -> tuple:
    """What changes with every token: the progress line and the four figures over time."""
    return (progress_text(result), throughput_figure(result), queue_figure(result), vllm_kv_figure(result),
            kv_tokens_figure(result))


def per_level_view(result: RunResult) -> tuple:
    """What changes only when a level begins or ends: the per-level bars, the ratio, the latency table and the
    ratio's computed caption."""
    summary = summary_dict(result)
    return tok_s_bars(summary), ratio_bars(summary), latency_table(summary), ratio_caption(summary)


def per_level_key(result: RunResult | None) -> tuple | None:
    """Changes when a level begins or ends, or the run ends (per_level_view's redraw key)."""
    if result is None:
        return None
    return result.id, len(result.levels), sum(lvl.summary is not None for lvl in result.levels), result.status


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
        what = "KV-cache budget" if registry.spec(name).kv_pool else "weights"
        health = _health_words(env.get("health", {}).get(name))
        line = f"**{name}** ({health}): {engine['attention']}; holds {held_text} of {what}"
        if engine["kv_total_blocks"]:
            line += (f"; KV at start-up: {engine['kv_total_blocks']} blocks x {engine['kv_block_size']} tokens "
                     f"({engine['kv_total_blocks'] * engine['kv_block_size']:,} token slots)")
        lines.append(line)
    for proc in device.get("extra", {}).get("processes", []):
        lines.append(f"**GPU memory, pid {proc['pid']}** ({proc['role']}): {proc['used_bytes'] / GIB:.2f} GiB (NVML)")
    if env.get("process_rss_bytes"):
        rss_mib = env["process_rss_bytes"] / 2**20
        lines.append(f"**This process (HF model, UI, vLLM client):** {rss_mib:.0f} MiB resident")
    for note in env["memory_plan"]["notes"]:
        lines.append(f"- {note}")
    lines.append(f"**Status:** {env['load_status']}")
    if env.get("shm_warning"):
        lines.append(f"**Warning:** {env['shm_warning']}.")
    lines.append("### Do the engines agree?\n\n" + agreement_markdown(env.get("agreement")))
    return "\n\n".join(lines)


def _health_words(health: dict | None) -> str:
    """'alive, started in 27 s' or 'dead: why'."""
    if not health:
        return "not loaded"
    words = str(health["state"]) + (f": {health['reason']}" if health["reason"] else "")
    return words + (f", last start {health['last_start_s']:.0f} s" if health.get("last_start_s") else "")


def agreement_markdown(agreement: dict | None) -> str:
    """The start-up agreement check as text: the verdicts, then one table per compared engine pair.

    Args:
        agreement: ``Host.agreement()``: None until two engines have loaded, else ok, verdicts, pairs.
    """
    if agreement is None:
        return "Not checked (yet): the check runs once two engines have loaded."
    parts = [f"- {_escape(verdict)}" for verdict in agreement["verdicts"]]
    parts += [_pair_table(pair) for pair in agreement["pairs"] if pair["prompts"]]
    return "\n\n".join(parts)


def agreement_warning(agreement: dict | None) -> str:
    """One line for the top of the page when two engines compute different text; empty otherwise."""
    if not agreement or agreement["ok"] is not False:
        return ""
    pairs = " and ".join(f"{p['other']} and {p['reference']}" for p in agreement["pairs"] if p["ok"] is False)
    return (f"**Warning:** {pairs} compute different text from the same model, so their speeds compare "
            "different computations: see the Environment tab.")


def _pair_table(pair: dict) -> str:
    """One pair's prompts as a markdown table, after a line saying what counts as agreeing."""
    ref, other = pair["reference"], pair["other"]
    intro = (f"**{other} against {ref}**, prompt by prompt (a divergence before token {pair['early_tokens']} "
             "is marked *early*):")
    head = f"| prompt | identical tokens | first divergence ({ref} vs {other}) | {ref} says | {other} says |"
    rows = [_prompt_row(p) for p in pair["prompts"]]
    return "\n".join([intro, "", head, "|---|---|---|---|---|", *rows])


def _prompt_row(p: dict) -> str:
    """One table row: the prompt, matched/total tokens, where and how they first differ, both answers."""
    return (f"| {_escape(p['prompt'])} | {p['matched_tokens']}/{p['total_tokens']} | {_divergence(p)} "
            f"| {_escape(p['reference_text'])} | {_escape(p['other_text'])} |")


def _divergence(p: dict) -> str:
    """'none', or the first differing position and both tokens (marked when it comes early)."""
    if p["diverged_at"] is None:
        return "none"
    flag = "" if p["ok"] else " **(early)**"
    return f"token {p['diverged_at']}: {_code(p['reference_token'])} vs {_code(p['other_token'])}{flag}"


def _code(token: str) -> str:
    """A token in a table cell, quoted so that spaces and newlines show."""
    return "`" + repr(token).replace("`", "'").replace("|", "\\|") + "`"


def _escape(text: str) -> str:
    """Model text made safe for a markdown table cell: no line breaks, pipes or markup."""
    text = text.replace("\\", "\\\\").replace("\n", " ↵ ").replace("`", "'")
    return "".join(f"\\{c}" if c in "|*_[]<>#~" else c for c in text)
