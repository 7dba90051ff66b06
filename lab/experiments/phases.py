"""phases: prefill-bound vs decode-bound work at several user levels, on both engines.

A decode step makes one token per running request and is cheap per token when many requests share it,
so decode-bound work (short prompts, long answers) gains most from concurrency; prefill already fills
the hardware with many prompt tokens at once, so prefill-bound work (long prompts, short answers) gains
little. Gain = output tok/s at the most users / output tok/s at the fewest.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.config import LoadConfig, RunPlan
from lab.estimate import planned_outputs
from lab.experiments import ended

WORKLOADS = ("prefill", "decode")
MAX_TOKENS = 8192  # output tokens the experiment may ask of each engine: at the defaults a few minutes on 2 cores;
#                    its first defaults (1-20 users, 256-512-token answers: 14,000 tokens) ran past 10 minutes


ENGINES = ("hf", "vllm")  # the engines this experiment needs loaded

@dataclass(frozen=True)
class Params:
    """users: levels; requests_per_user; decode_output_len: shortens the decode preset's answers (None: its
    own 256-512 tokens)."""

    users: tuple[int, ...] = (1, 5)
    requests_per_user: int = 1
    decode_output_len: int | None = None

    def plans(self, config) -> list[RunPlan]:
        """One plan per workload (each validates users, lengths and max_model_len)."""
        return [RunPlan(engines=("hf", "vllm"), engine=config, load=LoadConfig(
            users=self.users, workload=w, requests_per_user=self.requests_per_user, warmup_requests=1,
            output_len=self.decode_output_len if w == "decode" else None)) for w in WORKLOADS]

    def __post_init__(self) -> None:
        LoadConfig(users=self.users, requests_per_user=self.requests_per_user, output_len=self.decode_output_len)


def check(params: Params, config) -> None:
    """Both presets' longest requests must fit max_model_len (RunPlan's rule); the output tokens asked of each
    engine stay within MAX_TOKENS."""
    plans = params.plans(config)
    asked = sum(sum(planned_outputs(plan.load, users)) for plan in plans for users in params.users)
    if asked > MAX_TOKENS:
        raise ValueError(f"phases at users={','.join(map(str, params.users))} asks each engine for {asked:,} output "
                         f"tokens, past the limit of {MAX_TOKENS:,} (minutes per engine on a small CPU): give fewer "
                         f"users (users=1,5) or shorter answers (decode_output_len=64)")


async def run(session, params: Params, result, notify) -> None:
    """Each workload at every level on both engines; gains and latencies per engine."""
    for workload, plan in zip(WORKLOADS, params.plans(session.config), strict=True):
        result.run = session.new_result(plan)
        result.message = f"{workload}-bound work at {', '.join(map(str, params.users))} users"
        notify(result)
        ended(await session.run(plan, result=result.run))
        result.fields[workload] = summarize(result.run)
        result.rows += [{"workload": workload, "engine": s.engine, "users": s.users,
                         "output_tok_s": s.output_tok_s, "ttft_p50_s": s.ttft_s.p50, "tpot_p50_s": s.tpot_s.p50}
                        for s in result.run.summaries()]
        notify(result)


def summarize(run) -> dict:
    """Per engine: tok/s, TTFT and TPOT p50 per level, and the gain from the fewest to the most users."""
    out = {}
    for engine in run.plan.engines:
        levels = sorted((s for s in run.summaries() if s.engine == engine), key=lambda s: s.users)
        if not levels:
            continue
        low, high = levels[0].output_tok_s, levels[-1].output_tok_s
        out[engine] = {"gain": high / low if low else None,
                       "tok_s": {s.users: s.output_tok_s for s in levels},
                       "ttft_p50_s": {s.users: s.ttft_s.p50 for s in levels},
                       "tpot_p50_s": {s.users: s.tpot_s.p50 for s in levels}}
    return out
