"""How the Load test tab's "Workshop demo" preset was chosen: candidate short tests side by side, one session.

Loads both engines once (the app's default config for this device), runs every candidate form (the
preset of lab.app.dashboard.WORKSHOP_DEMO among them) with the same seeded requests, and prints each one's
wall time (what an attendee waits after pressing the button) and its vLLM/HF ratio per user level. The
preset is the candidate with the largest ratio at its top level among those that end within the time
limit (2 minutes on CPU, 1 on a GPU).

    python -m bench.workshop_demo [--device cpu|cuda] [--model DIR --load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

from lab.presets import WORKSHOP_DEMO, DemoPreset

CANDIDATES = {
    "cpu": [DemoPreset("1,5", "mixed", 32, 1), DemoPreset("1,5", "decode", 64, 1),
            DemoPreset("1,5", "equal", 64, 1), DemoPreset("1,4,8", "mixed", 24, 1),
            DemoPreset("1,5,10", "mixed", 32, 1), DemoPreset("1,5,10,20", "mixed", 32, 1)],
    "cuda": [DemoPreset("1,5,10,20", "mixed", 0, 2), DemoPreset("1,5,10,20", "decode", 128, 2),
             DemoPreset("1,8,32,64", "mixed", 0, 1)],
}
LIMIT_S = {"cpu": 120, "cuda": 60}


async def measure(config) -> list[tuple[DemoPreset, float, dict]]:
    """Every candidate on one session: (candidate, wall seconds, ratio per level)."""
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
            rows.append((preset, time.perf_counter() - started, result.ratio()))
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
    print(f"device: {read_device(device).to_dict().get('name')}; preset now: {WORKSHOP_DEMO[device]}")
    print(f"{'users':<11} {'workload':<8} {'out':>4} {'req/u':>5} {'wall s':>7}  vLLM/HF per level")
    for preset, wall_s, ratio in asyncio.run(measure(config)):
        ratios = "  ".join(f"{users}: {value:.2f}x" for users, value in ratio.items())
        late = "  (over the limit)" if wall_s > LIMIT_S[device] else ""
        print(f"{preset.users:<11} {preset.workload:<8} {preset.output_len:>4} {preset.requests_per_user:>5} "
              f"{wall_s:>7.1f}  {ratios}{late}")


if __name__ == "__main__":
    main()
