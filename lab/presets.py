"""The Load test tab's "Workshop demo": the most telling short test for the device the app runs on.

Chosen by measurement, not by taste: ``python -m bench.workshop_demo`` runs the candidates of each device
kind side by side on one session and prints each one's wall time and vLLM/HF ratio per level; the preset
is the candidate with the largest ratio at its top level that still ends within the time limit (2
minutes on CPU, 1 on a GPU) and stars no level as noisy (every engine finishes at least
lab.metrics.TRUSTED_REQUESTS requests per level over its repeats). Each
preset says so in ``why``, which the page shows beside the button.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.config import EngineConfig, LoadConfig, RunPlan, parse_users
from lab.load.workloads import mean_request


@dataclass(frozen=True)
class DemoPreset:
    """A short load test on both engines: user levels, workload, output length, requests per user, repeats."""

    users: str
    workload: str
    output_len: int  # 0: the workload's own lengths
    requests_per_user: int
    repeats: int = 1  # each level run this many times per engine: more finished requests, a ratio with a spread
    why: str = ""

    def plan(self, config: EngineConfig) -> RunPlan:
        """The validated RunPlan (both engines) on ``config``."""
        load = LoadConfig(users=parse_users(self.users), workload=self.workload,
                          output_len=self.output_len or None, requests_per_user=self.requests_per_user,
                          repeats=self.repeats)
        return RunPlan(load=load, engine=config)


WORKSHOP_DEMO = {
    "cpu": DemoPreset("3,8", "mixed", 24, 1, 4, why=(
        "3 and 8 users of `mixed` prompts, 24 output tokens each, one request per user, each level run 4 times: "
        "12 and 32 requests per engine, so no level is starred as noisy. Chosen with `python -m bench.workshop_demo` "
        "on a 2-core CPU: of ten candidates, the largest vLLM/HF ratio at its top level (mean of two runs) among "
        "those that end within 2 minutes with at least 10 requests per engine at every level (docs/benchmarks.md).")),
    "cuda": DemoPreset("10,32,64", "mixed", 0, 1, why=(
        "10, 32 and 64 users of `mixed` prompts at their own lengths, one request per user: at least 10 requests per "
        "engine at every level, so no level is starred as noisy. Chosen with `python -m bench.workshop_demo` on an "
        "H200: of five candidates, the largest vLLM/HF ratio at its top level (mean of two runs) among those that end "
        "within a minute with at least 10 requests per engine at every level (docs/benchmarks.md).")),
}


def workshop_demo(config: EngineConfig) -> DemoPreset:
    """The Workshop demo preset for the device the engines run on."""
    return WORKSHOP_DEMO["cuda" if config.resolved_device() == "cuda" else "cpu"]


def demo_pool_tokens(config: EngineConfig) -> int:
    """The KV tokens the Workshop demo's top level holds on average: its users x a mean request's prompt and
    output (computed). On CUDA, vLLM's default pool is this many token slots, so the demo fills half of it or more
    (a pool of half an 80 GB card would show a 135M model's KV as 0.4% of it)."""
    demo = workshop_demo(config)
    prompt, output = mean_request(demo.workload, demo.output_len or None)
    return int(max(parse_users(demo.users)) * (prompt + output))
