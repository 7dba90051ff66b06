"""Pure loaders behind the dashboard: turn user input into plans and runs into what the page shows.

No gradio here: lab/app/ui.py only lays out components and wires these functions to events, and the
notebooks can call them too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Generic, TypeVar

from lab.capacity import FLAGS, CapacityPlan, capacity_plan
from lab.config import (
    MAX_RATE,
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
from lab.metrics.levels_words import ratio_caption
from lab.metrics.steps_words import factors_caption
from lab.metrics.turns_words import chat_answer
from lab.plots import (
    kv_tokens_figure,
    latency_table,
    queue_figure,
    ratio_bars,
    throughput_figure,
    tok_s_bars,
    turn_ttft_figure,
    vllm_kv_figure,
)
from lab.runs import RunResult, summary_dict
from lab.status import RequestStatus, RunStatus

BOUND_REQUESTS, BOUND_SECONDS = "requests per user", "seconds per level"
RATE_FIELD = "Open loop: requests/s (0 = closed loop)"
CAPACITY_SLO = "ttft_p95=2s,tpot_p95=150ms"  # the Capacity form's empty target: the CLI's example
CAPACITY_NAMES = {key: key for key in FLAGS}  # a refusal names the Capacity form's field (its label says the name)
CAPACITY_NUMBERS = (("max_users", "max_users", whole), ("requests_per_user", "requests_per_user", whole),
           ("min_requests", "min_requests", whole), ("output_len", "output_len", whole),
           ("time_limit", "time_limit_s", decimal), ("start_rate", "start_rate", decimal),
           ("max_rate", "max_rate", decimal))  # the form's numbers: (field, capacity_plan's keyword, rule)


def engine_choices(loaded) -> list[tuple[str, str]]:
    """The form's engine choices: (label, name) of each loaded engine, the registry's kinds in its order, then
    the endpoints (labelled by their own names)."""
    kinds = [name for name in registry.names() if name in loaded]
    return [(registry.label(name), name) for name in kinds + [n for n in loaded if n not in kinds]]


T = TypeVar("T")


def parts(named) -> list:
    """A named group's members in its declared order (what Gradio's inputs and outputs lists take)."""
    return [getattr(named, f.name) for f in fields(named)]


@dataclass
class LoadForm(Generic[T]):
    """The Load-test form by field name: the page holds one of components, a handler one of their values (the
    declared order is the order Gradio passes them in, and the start_run API's)."""

    engines: T
    users: T
    workload: T
    output_len: T
    bound: T
    amount: T
    repeats: T
    rate: T
    slo: T

    @classmethod
    def of_load(cls, engines, load: dict) -> LoadForm:
        """The form that asks for a stored run's load (summary.json's ``load``, with its users and workload)."""
        by_count = bool(load.get("requests_per_user"))
        return cls(engines=list(engines), users=",".join(map(str, load["users"])), workload=load["workload"],
                   output_len=load.get("output_len") or 0, bound=BOUND_REQUESTS if by_count else BOUND_SECONDS,
                   amount=load["requests_per_user"] if by_count else load.get("duration_s"),
                   repeats=load.get("repeats", 1), rate=load.get("rate") or 0,
                   slo=",".join(f"{name}={limit:g}" for name, limit in dict(load.get("slo") or {}).items()))

    @classmethod
    def of_plan(cls, plan: RunPlan) -> LoadForm:
        """The form that asks for ``plan``."""
        load = plan.load
        return cls.of_load(plan.engines, {"users": load.users, "workload": load.workload, "output_len": load.output_len,
                                          "requests_per_user": load.requests_per_user, "duration_s": load.duration_s,
                                          "repeats": load.repeats, "rate": load.rate, "slo": load.slo})

    @classmethod
    def of_summary(cls, summary: dict) -> LoadForm:
        """The form that asks for a stored run's plan (summary.json)."""
        return cls.of_load(summary["engines"], {**summary["load"], "users": summary["users"],
                                                "workload": summary["workload"]})


def plan_from_inputs(config: EngineConfig, *, engines: list[str] | None, users: str, workload: str,
                     output_len: float | None, bound: str, amount: float | None, repeats: float | None = 1,
                     rate: float | None = 0, slo: str = "") -> RunPlan:
    """A validated RunPlan from the Load-test form's named values (``plan_from_inputs(config, **vars(form))``).

    Args:
        config: The loaded engines' config (for max_model_len).
        engines: Ticked engines.
        users: e.g. '1,5,10,20'.
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
    users_tuple = parse_users(users or "")
    out = whole(output_len, "Output length (0 = the workload's)", low=0) or None  # 0: the workload's own lengths
    if bound not in (BOUND_REQUESTS, BOUND_SECONDS):
        raise ValueError(f"Bound each level by: choose {BOUND_REQUESTS} or {BOUND_SECONDS}, not {bound!r}.")
    open_loop = open_loop_rate(rate)
    load = LoadConfig(
        users=users_tuple, workload=workload, output_len=out, repeats=whole(repeats, "Repeats", 1, MAX_REPEATS),
        requests_per_user=whole(amount, "Requests per user", low=1) if bound == BOUND_REQUESTS else None,
        duration_s=decimal(amount, "Seconds per level") if bound == BOUND_SECONDS else None,
        rate=open_loop, slo=parse_slo(slo or ""),
    )
    return RunPlan(engines=tuple(engines or ()), load=load, engine=config)


@dataclass
class CapacityForm(Generic[T]):
    """The Capacity form by field name (the declared order is the order Gradio passes them in, and the
    start_capacity API's); the page holds one of components, a handler one of their values."""

    slo: T
    engines: T
    max_users: T
    workload: T
    output_len: T
    requests_per_user: T
    min_requests: T
    time_limit: T
    rate_search: T
    start_rate: T
    max_rate: T


def form_plan(form: CapacityForm, config, loaded) -> CapacityPlan:
    """The validated CapacityPlan the form's values ask for (ValueError naming the field); an empty number keeps
    the CLI's default, an output length of 0 the workload's lengths."""
    numbers = {key: rule(getattr(form, name), name) for name, key, rule in CAPACITY_NUMBERS
               if getattr(form, name) not in (None, "")}
    numbers["output_len"] = numbers.get("output_len") or None
    return capacity_plan(form.slo or CAPACITY_SLO, chosen_engines(form.engines, loaded), config,
                         workload=form.workload, rate_search=bool(form.rate_search), names=CAPACITY_NAMES, **numbers)


def chosen_engines(chosen, loaded) -> tuple[str, ...]:
    """The engines ticked, each loaded here (ValueError naming the field and the choices where none is, or one is
    not loaded)."""
    if not chosen:
        raise ValueError(f"engines: choose at least one of {', '.join(loaded)}")
    unknown = [name for name in chosen if name not in loaded]
    if unknown:
        raise ValueError(f"engines: {unknown[0]!r} is not loaded here; choose from {', '.join(loaded)}")
    return tuple(chosen)


def open_loop_rate(rate: float | None) -> float | None:
    """The page's rate field: 0 is a closed loop (None), else a rate above 0 and at most MAX_RATE a second."""
    value = decimal(rate, RATE_FIELD)
    if value and not 0 < value <= MAX_RATE:
        raise ValueError(f"{RATE_FIELD}: give 0 for a closed loop (each user sends its next request when the last "
                         f"one ends) or a rate above 0 and at most {MAX_RATE:g} requests per second, not {value:g}")
    return value or None


def progress_text(result: RunResult | None) -> str:
    """One line: which engine and level is running and how many requests are done."""
    if result is None:
        return "No run yet: once the line at the top says the engines are ready, choose a workload and press Run."
    current = result.current()
    total_done = sum(len(lvl.records) for lvl in result.levels)
    if result.status == RunStatus.RUNNING and current is not None:
        planned = f"/{current.planned}" if current.planned else ""
        return (f"Running {result.id}: **{registry.label(current.engine)}** at **{current.users}** "
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


@dataclass
class TaskView(Generic[T]):
    """A task tab's result by name (the Why, Capacity and KV cache tabs): its progress line, its figure, what the lab
    reads from it, and its table; the page holds one of components, a handler one of their values."""

    progress: T
    figure: T
    caption: T
    table: T


@dataclass
class Compared(Generic[T]):
    """The Results tab's comparison by name: the chosen runs' tok/s and ratio figures, then the first one's latency
    table, engine args, requests.csv, summary.json and report."""

    tok_s: T
    ratio: T
    latency: T
    args: T
    requests: T
    summary: T
    report: T


@dataclass
class OverTime(Generic[T]):
    """What changes with every token: the progress line and the four figures over time."""

    progress: T
    throughput: T
    queue: T
    vllm_kv: T
    kv_tokens: T


@dataclass
class PerLevel(Generic[T]):
    """What changes only when a level begins or ends: the per-level bars, the ratio, the latency table, the
    ratio's computed caption and the TTFT per turn (chat)."""

    bars: T
    ratio: T
    latency: T
    caption: T
    turns: T


def over_time_view(result: RunResult) -> OverTime:
    """The progress line and the four figures over time of a live or finished run."""
    return OverTime(progress=progress_text(result), throughput=throughput_figure(result), queue=queue_figure(result),
                    vllm_kv=vllm_kv_figure(result), kv_tokens=kv_tokens_figure(result))


def per_level_view(result: RunResult) -> PerLevel:
    """The per-level figures of a live or finished run (stored_view of its summary)."""
    return stored_view(summary_dict(result))


def stored_view(summary: dict) -> PerLevel:
    """The per-level bars, the ratio, the latency table, the ratio's computed caption (with a chat run's per-turn
    sentences) and the TTFT per turn, of a run's summary.json."""
    caption = "\n\n".join(p for p in [ratio_caption(summary), factors_caption(summary), *chat_answer(summary)] if p)
    return PerLevel(bars=tok_s_bars(summary), ratio=ratio_bars(summary), latency=latency_table(summary),
                    caption=caption, turns=turn_ttft_figure(summary))


def stored_progress(summary: dict | None) -> str:
    """The progress line of a page opened before this app ran anything: the newest stored run, if any."""
    if summary is None:
        return progress_text(None)
    when = summary["started_at"][:16].replace("T", " ")
    return (f"Last run {summary['run_id']} ({summary['status']}, {when} UTC), stored: its settings in the form, its "
            "per-level figures here (figures over time are drawn live).")


def busy_words(task) -> str:
    """What goes now in a few words, or empty: the busy line at the top of the page (and its change key)."""
    if task is not None and task.status == RunStatus.RUNNING:
        return f"{task.KIND.capitalize()} {task.id} running: {task.message}"
    return ""


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
        line = f"**{registry.label(name)}** ({health}): {engine['attention']}; holds {held_text} of {what}"
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
    pairs = " and ".join(f"{registry.label(p['other'])} and {registry.label(p['reference'])}"
                         for p in agreement["pairs"] if p["ok"] is False)
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
