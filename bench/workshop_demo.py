"""How the Load test tab's "Workshop demo" preset was chosen: candidate short tests side by side, one session.

Loads both engines once (the app's default config for this device), runs every candidate form (the
preset of lab.presets.WORKSHOP_DEMO among them) with the same seeded requests, and prints each one's
wall time (what an attendee waits after pressing the button) and its vLLM/HF ratio per user level. The
preset is the candidate with the largest ratio at its top level among the eligible ones: those that end
within the time limit (2 minutes on CPU, 1 on a GPU) and have no thin level (one where an engine finished
fewer than lab.metrics.TRUSTED_REQUESTS requests over its repeats: the page stars its ratio as noisy).

    python -m bench.workshop_demo [--device cpu|cuda] [--model DIR --load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

from lab.metrics import thin_levels
from lab.presets import WORKSHOP_DEMO, DemoPreset

CANDIDATES = {  # on CPU, users x requests per user x repeats >= 10 at the lowest level (the first: the old preset)
    "cpu": [DemoPreset("1,4,8", "mixed", 24, 1), DemoPreset("1,4,8", "mixed", 24, 4, 3),
            DemoPreset("1,4,8", "equal", 16, 4, 3), DemoPreset("1,4,8", "decode", 16, 4, 3),
            DemoPreset("1,8", "decode", 24, 5, 2), DemoPreset("4,8", "mixed", 24, 1, 3),
            DemoPreset("4,8", "mixed", 24, 3), DemoPreset("3,8", "mixed", 24, 1, 4),
            DemoPreset("2,8", "mixed", 24, 1, 5), DemoPreset("2,4,8", "mixed", 24, 1, 5)],
    "cuda": [DemoPreset("1,5,10,20", "mixed", 0, 2), DemoPreset("1,5,10,20", "decode", 128, 2),
             DemoPreset("1,8,32,64", "mixed", 0, 1), DemoPreset("10,32,64", "mixed", 0, 1),
             DemoPreset("8,32,64", "mixed", 0, 1, 2)],
}
LIMIT_S = {"cpu": 120, "cuda": 60}


async def measure(config) -> list[tuple[DemoPreset, float, dict, list[int]]]:
    """Every candidate on one session: (candidate, wall seconds, ratio per level, thin levels), each row printed as
    it is measured (a run cut short keeps what it printed)."""
    from lab.session import LabSession

    device = config.resolved_device()
    session = LabSession(config, ("hf", "vllm"))
    await session.start()
    rows = []
    try:
        for preset in CANDIDATES[device]:
            plan = preset.plan(config)
            started = time.perf_counter()
            result = await session.run(plan)
            thin = thin_levels(s.to_dict() for s in result.summaries())
            rows.append((preset, time.perf_counter() - started, result.ratio(), thin))
            print(row_line(*rows[-1], LIMIT_S[device]), flush=True)
    finally:
        await session.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: what the lab picks)")
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded model)")
    parser.add_argument("--load-format", default="auto", help="dummy: random weights (config + tokenizer only)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the table only
    from lab.config import EngineConfig
    from lab.environment import read_device

    config = EngineConfig(device=args.device or "auto", model=args.model, load_format=args.load_format)
    device = config.resolved_device()
    now = WORKSHOP_DEMO[device]
    print(f"device: {read_device(device).to_dict().get('name')}; preset now: {now.users} {now.workload} "
          f"{now.output_len} {now.requests_per_user} x{now.repeats}")
    print(f"{'users':<11} {'workload':<8} {'out':>4} {'req/u':>5} {'rep':>3} {'wall s':>7}  vLLM/HF per level")
    rows = asyncio.run(measure(config))
    chosen = pick(rows, LIMIT_S[device])
    print(f"chosen by the rule: {chosen or 'none eligible'}")


def row_line(preset: DemoPreset, wall_s: float, ratio: dict, thin: list[int], limit_s: float) -> str:
    """One candidate's row: its form, wall seconds, vLLM/HF per level and why it is not eligible (if so)."""
    ratios = "  ".join(f"{users}: {value:.2f}x" for users, value in ratio.items())
    return (f"{preset.users:<11} {preset.workload:<8} {preset.output_len:>4} {preset.requests_per_user:>5} "
            f"{preset.repeats:>3} {wall_s:>7.1f}  {ratios}{refusal(wall_s, thin, limit_s)}")


def refusal(wall_s: float, thin: list[int], limit_s: float) -> str:
    """Why a candidate is not eligible ("" when it is): over the time limit, or thin levels (starred as noisy)."""
    reasons = ["over the limit"] * (wall_s > limit_s) + [f"thin at {', '.join(map(str, thin))} users"] * bool(thin)
    return f"  (not eligible: {'; '.join(reasons)})" if reasons else ""


def pick(rows: list[tuple[DemoPreset, float, dict, list[int]]], limit_s: float) -> DemoPreset | None:
    """The eligible candidate with the largest ratio at its top level (None when none is eligible)."""
    eligible = [(ratio[max(ratio)], preset) for preset, wall_s, ratio, thin in rows
                if ratio and not refusal(wall_s, thin, limit_s)]
    return max(eligible, key=lambda pair: pair[0])[1] if eligible else None


if __name__ == "__main__":
    main()
