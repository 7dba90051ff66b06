"""phases: prefill-bound vs decode-bound work at several user levels, on both engines.

A decode step makes one token per running request and is cheap per token when many requests share it,
so decode-bound work (short prompts, long answers) gains most from concurrency; prefill already fills
the hardware with many prompt tokens at once, so prefill-bound work (long prompts, short answers) gains
little. Gain = output tok/s at the most users / output tok/s at the fewest, per repeat (the same requests each
time, engines interleaved); the gain reported is the median of the repeats', with their spread.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from lab.config import LoadConfig, RunPlan
from lab.estimate import planned_outputs
from lab.experiments import ended

WORKLOADS = ("prefill", "decode")
DECODE_WORKLOADS = ("decode", "spread")  # short prompts, answers longer than them
MAX_TOKENS = {"cpu": 8192, "cuda": 262144}  # output tokens the experiment may ask of each engine: on 2 cores a few
#   minutes (its first defaults, 1-20 users of 256-512-token answers, 14,000 tokens, ran past 10 minutes); a GPU
#   makes thousands of tokens a second


ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded


@dataclass(frozen=True)
class Params:
    """users: levels; requests_per_user; prefill_requests_per_user: the prefill-bound work's own (None: as
    requests_per_user; one already fills a step with a whole prompt, and each of its requests costs seconds on a
    CPU); decode_output_len: shortens the decode-bound answers (None: the workload's own); decode_workload: decode
    (answers of 256-512 tokens) or spread (8-96: short, and of different lengths); repeats: runs of every level (the
    gains get a spread)."""

    users: tuple[int, ...] = (1, 5)
    requests_per_user: int = 1
    prefill_requests_per_user: int | None = None
    decode_output_len: int | None = None
    decode_workload: str = "decode"
    repeats: int = 1

    def plans(self, config) -> list[RunPlan]:
        """One plan per workload (each validates users, lengths, repeats and max_model_len)."""
        return [RunPlan(engines=("hf", "vllm"), engine=config, load=LoadConfig(
            users=self.users, workload=self.workload(w), requests_per_user=self.requests(w), warmup_requests=1,
            output_len=self.decode_output_len if w == "decode" else None, repeats=self.repeats)) for w in WORKLOADS]

    def workload(self, kind: str) -> str:
        """The workload that stands for prefill- or decode-bound work."""
        return self.decode_workload if kind == "decode" else kind

    def requests(self, kind: str) -> int:
        """Requests per user of prefill- or decode-bound work."""
        if kind == "prefill" and self.prefill_requests_per_user:
            return self.prefill_requests_per_user
        return self.requests_per_user

    def __post_init__(self) -> None:
        if self.decode_workload not in DECODE_WORKLOADS:
            raise ValueError(f"decode_workload must be one of {', '.join(DECODE_WORKLOADS)}, "
                             f"not {self.decode_workload!r}")
        LoadConfig(users=self.users, requests_per_user=self.requests_per_user, output_len=self.decode_output_len,
                   repeats=self.repeats)
        if self.prefill_requests_per_user is not None:
            try:
                LoadConfig(users=self.users, requests_per_user=self.prefill_requests_per_user)
            except ValueError as exc:
                raise ValueError(f"prefill_requests_per_user: {exc}") from None


def check(params: Params, config) -> None:
    """Both presets' longest requests must fit max_model_len (RunPlan's rule); the output tokens asked of each
    engine stay within MAX_TOKENS."""
    plans = params.plans(config)
    asked = params.repeats * sum(sum(planned_outputs(plan.load, users)) for plan in plans for users in params.users)
    bound = MAX_TOKENS["cuda" if config.resolved_device() == "cuda" else "cpu"]
    if asked > bound:
        raise ValueError(f"phases at users={','.join(map(str, params.users))} asks each engine for {asked:,} output "
                         f"tokens, past the limit of {bound:,} (minutes per engine on a small CPU): give fewer "
                         f"users (users=1,5), shorter answers (decode_output_len=64) or fewer repeats")


async def run(session, params: Params, result, notify) -> None:
    """Each workload at every level on both engines; gains and latencies per engine."""
    for workload, plan in zip(WORKLOADS, params.plans(session.config), strict=True):
        result.run = session.new_result(plan)
        result.message = f"{workload}-bound work at {', '.join(map(str, params.users))} users"
        notify(result)
        ended(await session.run(plan, result=result.run))
        result.fields[workload] = summarize(result.run)
        result.rows += level_rows(workload, result.run)
        notify(result)


def level_rows(workload: str, run) -> list[dict]:
    """One row per engine, level and repeat of a run: its output tok/s, TTFT and TPOT p50 (measured)."""
    return [{"workload": workload, "engine": s.engine, "users": s.users, "repeat": s.repeat,
             "output_tok_s": s.output_tok_s, "ttft_p50_s": s.ttft_s.p50, "tpot_p50_s": s.tpot_s.p50}
            for s in run.summaries()]


def summarize(run) -> dict:
    """Per engine: tok/s (mean of the repeats), TTFT and TPOT p50 (median) per level, and the gain from the fewest
    to the most users: the median of the repeats' own gains, with their spread."""
    out = {}
    for engine in run.plan.engines:
        levels = [s for s in run.summaries() if s.engine == engine]
        users = sorted({s.users for s in levels})
        if not users:
            continue
        at = {(s.users, s.repeat): s for s in levels}
        repeats = sorted({s.repeat for s in levels})
        gains = [at[users[-1], r].output_tok_s / at[users[0], r].output_tok_s for r in repeats
                 if (users[-1], r) in at and (users[0], r) in at and at[users[0], r].output_tok_s]
        out[engine] = {**median_spread("gain", gains),
                       "tok_s": {u: _mean(s.output_tok_s for s in levels if s.users == u) for u in users},
                       "ttft_p50_s": {u: _median(s.ttft_s.p50 for s in levels if s.users == u) for u in users},
                       "tpot_p50_s": {u: _median(s.tpot_s.p50 for s in levels if s.users == u) for u in users}}
    return out


def step_up(rows: list[dict], run, workload: str = "decode") -> dict:
    """One more level against a phases result, repeat by repeat: ``run`` holds the new level (the same workload,
    requests and repeats), ``rows`` the phases result's rows. Per engine, each repeat's gain from the fewest users
    of ``workload`` to the new level and its step from the most users to it (output tok/s over output tok/s of the
    same repeat), each the median of the repeats' with their spread; and the new level's tok/s (mean of the
    repeats). Pairing each repeat with the first run's same repeat gives the step a spread of its own, and the
    first run's 1-user level is not run again."""
    first = {(r["engine"], r["users"], r["repeat"]): r["output_tok_s"] for r in rows if r["workload"] == workload}
    out = {}
    for engine in run.plan.engines:
        users = sorted({u for e, u, _ in first if e == engine})
        new = {s.repeat: s.output_tok_s for s in run.summaries() if s.engine == engine}
        if not users or not new:
            continue
        out[engine] = {**median_spread("gain", _over(new, first, engine, users[0])),
                       **median_spread("step", _over(new, first, engine, users[-1])),
                       "tok_s": {run.plan.load.users[0]: _mean(new.values())}}
    return out


def _over(new: dict[int, float], first: dict, engine: str, users: int) -> list[float]:
    """Each repeat's new tok/s over the first run's at ``users`` (the same repeat; none where it made nothing)."""
    return [tok_s / first[engine, users, r] for r, tok_s in new.items()
            if tok_s is not None and first.get((engine, users, r))]


def median_spread(name: str, values: list[float]) -> dict:
    """{name: the median, name_spread: low, high and n} of the repeats' values (None and None without any)."""
    if not values:
        return {name: None, f"{name}_spread": None}
    return {name: statistics.median(values),
            f"{name}_spread": {"low": min(values), "high": max(values), "n": len(values)}}


def _mean(values) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def _median(values) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None
