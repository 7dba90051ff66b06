"""Is the lab's HF figure a fair generate()? Lab HF engine vs a plain call like the seeds' hf_baseline.py.

The plain call: 16 copies of "Write a short story about AI.", padded, one model.generate() with
exactly 128 new tokens, tok/s = new tokens / wall time. The lab: the 'equal' workload (the same prompt,
128 tokens) with 16 closed-loop users sending one request each, so its static batcher forms the same
batch. Printed side by side as a ratio in one run. Usage: python -m bench.lab_vs_plain_hf [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.load.workloads import SEED_PROMPT
from lab.session import LabSession

BATCH, NEW_TOKENS = 16, 128


def plain_tok_s(session: LabSession, rounds: int) -> float:
    """hf_baseline.py's measurement on the lab's own loaded model object."""
    engine = session.engines["hf"]
    torch, model, tokenizer = engine.torch, engine.model, engine.tokenizer
    tokenizer.padding_side = "left"
    inputs = tokenizer([SEED_PROMPT] * BATCH, return_tensors="pt", padding=True).to(engine.device)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=engine.pad_id)
        elapsed = time.perf_counter() - start
        best = max(best, (out.shape[1] - inputs["input_ids"].shape[1]) * BATCH / elapsed)
    return best


async def measure(rounds: int) -> tuple[float, float]:
    session = LabSession(EngineConfig(), ("hf",))
    await session.start()
    try:
        plan = RunPlan(engines=("hf",), load=LoadConfig(users=(BATCH,), requests_per_user=1, workload="equal",
                                                       warmup_requests=1))
        lab = 0.0
        for _ in range(rounds):
            result = await session.run(plan)
            lab = max(lab, result.levels[0].summary.output_tok_s)
        plain = await asyncio.to_thread(plain_tok_s, session, rounds)
        return lab, plain
    finally:
        await session.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="best of N for each side")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    lab, plain = asyncio.run(measure(args.rounds))
    print(f"\nplain generate() ({BATCH} x '{SEED_PROMPT}', {NEW_TOKENS} new tokens): {plain:8.1f} tok/s")
    print(f"lab HF engine ('equal' workload, {BATCH} users x 1 request):          {lab:8.1f} tok/s")
    print(f"lab/plain = {lab / plain:.2f}")


if __name__ == "__main__":
    main()
