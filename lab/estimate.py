"""How long a run will take on this device, learned from the runs stored for it (never a guess from nowhere).

For each engine and user level of a plan: the output tokens the level will ask for (the same seeded
lengths the run sends) divided by the output tok/s that engine measured on this device and model at the
nearest stored user level; a level bounded by time takes its duration. With no stored run of an engine on
this device and model there is no estimate, and the text says so. Loading and warm-up are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lab.config import RunPlan, duration_words
from lab.load.workloads import sample_specs
from lab.runs import level_seed


def measured_rates(summaries: list[dict], model: str, device_name: str) -> dict[str, dict[int, float]]:
    """engine -> users -> output tok/s, from stored summary.json dicts (newest first: the newest wins)."""
    rates: dict[str, dict[int, float]] = {}
    for summary in summaries:
        if summary.get("model") != model or summary.get("device", {}).get("name") != device_name:
            continue
        for level in summary.get("runs", []):
            if level.get("completed") and level.get("output_tok_s"):
                rates.setdefault(level["engine"], {}).setdefault(level["users"], level["output_tok_s"])
    return rates


def nearest_rate(by_users: dict[int, float], users: int) -> float:
    """The tok/s measured at the user level nearest ``users`` (by ratio: 5 is nearer 4 than 10 is)."""
    return by_users[min(by_users, key=lambda u: abs(math.log(u / users)))]


def level_output_tokens(plan: RunPlan, users: int) -> int:
    """Output tokens one engine is asked for at one count-bounded level (the run's own seeded lengths)."""
    load = plan.load
    specs = sample_specs(load.workload, users * load.requests_per_user, level_seed(load, users), load.output_len)
    return sum(spec.output_len for spec in specs)


@dataclass(frozen=True)
class Estimate:
    """Seconds the run should take (None when an engine has no stored measurement), and which engines lack one."""

    seconds: float | None
    missing: tuple[str, ...]


def estimate_run(plan: RunPlan, rates: dict[str, dict[int, float]]) -> Estimate:
    """Sum over engines and levels of tokens / measured tok/s (or the level's duration)."""
    missing = tuple(engine for engine in plan.engines if not rates.get(engine))
    if missing:
        return Estimate(None, missing)
    load, total = plan.load, 0.0
    for engine in plan.engines:
        for users in load.users:
            total += load.duration_s or level_output_tokens(plan, users) / nearest_rate(rates[engine], users)
    return Estimate(total * load.repeats, ())


def estimate_text(plan: RunPlan, summaries: list[dict], model: str, device_name: str) -> str:
    """One line for the page under the form."""
    estimate = estimate_run(plan, measured_rates(summaries, model, device_name))
    if estimate.seconds is None:
        return (f"No time estimate yet: no finished run of {', '.join(estimate.missing)} with {model} on "
                f"{device_name} is stored; the first run teaches it.")
    return (f"Estimated time: about {duration_words(estimate.seconds)} (the output tok/s of the runs stored for "
            f"{device_name}, at the nearest user level; loading and warm-up not counted).")
