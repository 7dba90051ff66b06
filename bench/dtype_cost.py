"""What the CPU dtype costs: bf16 vs fp32 (and vLLM's AMX attention, where the CPU has it), in one run.
The lab's "auto" dtype picks fp32 where the CPU only emulates bf16 (no AVX512_BF16 or AMX).

Each configuration loads both engines in a fresh process (as the lab does), runs the start-up agreement
check and one load level with the same seeded requests, and reports both engines' output tok/s. The
table prints the configurations side by side with vLLM/HF and the speed of each against the default.

    python -m bench.dtype_cost [--users 5] [--requests-per-user 2] [--output-len 64]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys

CONFIGS = {
    "bf16": {"dtype": "bfloat16"},
    "bf16, vLLM AMX attention": {"dtype": "bfloat16", "cpu_attention": "amx"},
    "fp32": {"dtype": "float32"},
}


async def measure(fields: dict, args) -> dict:
    """Both engines under one config: agreement, then tok/s at one user level (child process)."""
    from lab.config import EngineConfig, LoadConfig, RunPlan
    from lab.session import LabSession

    config = EngineConfig(device="cpu", max_model_len=1024, kv_cache_gib=0.5, **fields)
    plan = RunPlan(engines=("hf", "vllm"), engine=config, load=LoadConfig(
        users=(args.users,), requests_per_user=args.requests_per_user, output_len=args.output_len))
    session = LabSession(config, plan.engines)
    await session.start()
    try:
        result = await session.run(plan)
    finally:
        await session.stop()
    tok_s = {s.engine: s.output_tok_s for s in result.summaries()}
    return {"agree": session.agreement.ok, "verdict": session.agreement.verdicts()[0], "tok_s": tok_s,
            "cpu_attention": result.engine_info["vllm"].args.get("cpu_attention")}


def run_child(name: str, args) -> dict | None:
    """Run one configuration in a fresh process and parse its result line."""
    proc = subprocess.run([sys.executable, "-m", "bench.dtype_cost", "--child", name, "--users", str(args.users),
                           "--requests-per-user", str(args.requests_per_user), "--output-len", str(args.output_len)],
                          capture_output=True, text=True, timeout=1800)
    line = next((row for row in proc.stdout.splitlines() if row.startswith("RESULT ")), None)
    if line is None:
        logging.error("%s failed:\n%s", name, proc.stderr[-2000:])
        return None
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.child:
        import asyncio

        print("RESULT " + json.dumps(asyncio.run(measure(CONFIGS[args.child], args))), flush=True)
        return
    from lab.environment import has_amx, read_cpu

    print(f"cpu: {read_cpu().name}, {read_cpu().cores} cores, AMX: {has_amx()}; {args.users} users x "
          f"{args.requests_per_user} requests, {args.output_len} output tokens, mixed prompts")
    results = {name: run_child(name, args) for name in CONFIGS if has_amx() or "AMX" not in name}
    base = results["bf16"]
    print(f"{'config':<26} {'agree':>6} {'HF tok/s':>9} {'vLLM tok/s':>11} {'vLLM/HF':>8} {'HF vs default':>14} "
          f"{'vLLM vs default':>16}  vLLM CPU attention")
    for name, r in results.items():
        if r is None:
            print(f"{name:<26} failed")
            continue
        hf, vllm = r["tok_s"]["hf"], r["tok_s"]["vllm"]
        print(f"{name:<26} {r['agree']!s:>6} {hf:>9.1f} {vllm:>11.1f} {vllm / hf:>7.2f}x "
              f"{hf / base['tok_s']['hf']:>13.2f}x {vllm / base['tok_s']['vllm']:>15.2f}x  {r['cpu_attention']}")
    for name, r in results.items():
        if r is not None:
            print(f"{name}: {r['verdict']}")


if __name__ == "__main__":
    main()
