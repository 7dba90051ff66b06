"""vLLM's step caps as the lab used to set them against `vllm serve`'s defaults, paired and interleaved.

Two served vLLMs (AsyncLLM) load side by side in one process: ``old`` with the lab's former caps (2,048 tokens and
256 sequences a step: AsyncLLM's fallback and the lab's own sequence cap) and ``serve`` with what the lab now
gives by default (`vllm serve`'s caps for the device, asked of vLLM: lab.engines.vllm_caps.batch_limits). Each workload
is one `lab bench`-like run whose levels interleave the two faces repeat by repeat (lab.runs.level_order), so
drift favours neither. Prints tok/s and TTFT p50/p99 per face and repeat, and writes each run's summary.json.

    python -m bench.serve_defaults --device cuda --kv-cache-gib 8 --gpu-memory-utilization 0.25 \
        --workloads mixed,sharegpt --users 64 --repeats 3 --out /tmp/serve-defaults
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

OLD = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
FACES = ("old", "serve")


def parse(argv=None) -> argparse.Namespace:
    from lab.options import add_engine_args

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mixed,sharegpt")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--requests-per-user", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/serve-defaults")
    add_engine_args(parser)
    return parser.parse_args(argv)


def register_faces() -> None:
    """The two faces as engine kinds of their own (a plan names engines from the registry)."""
    from lab.engines.registry import EngineSpec, register

    for face in FACES:
        register(EngineSpec(face, f"vLLM ({face})", "lab.engines.vllm:VLLMEngine", f"vLLM, {face} step caps",
                            paged=True, memory="pool"))


async def start_faces(config, model_path: str) -> dict:
    """Both faces, started one after the other, each named for its caps."""
    from lab.engines.vllm import VLLMEngine

    engines = {"old": VLLMEngine(config.with_overrides(**OLD), model_path), "serve": VLLMEngine(config, model_path)}
    for name, engine in engines.items():
        engine.name = name
        await engine.start()
    return engines


def face_rows(summary: dict) -> list[dict]:
    """One row per face and repeat: tok/s, TTFT p50 and p99, the step caps it ran with."""
    caps = {name: {k: args.get(k) for k in OLD} for name, args in summary["engine_args"].items()}
    return [{"workload": summary["workload"], "face": r["engine"], "repeat": r["repeat"], **caps[r["engine"]],
             "output_tok_s": round(r["output_tok_s"], 1), "ttft_p50_ms": round(r["ttft_s"]["p50"] * 1000, 1),
             "ttft_p99_ms": round(r["ttft_s"]["p99"] * 1000, 1)} for r in summary["runs"]]


async def main(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from lab.config import LoadConfig, RunPlan
    from lab.model import resolve_model
    from lab.options import engine_config_from
    from lab.runs import RunResult, execute, summary_dict, write_run

    register_faces()
    config = engine_config_from(args)
    model_path = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engines = await start_faces(config, model_path)
    rows = []
    try:
        for workload in args.workloads.split(","):
            load = LoadConfig(users=(args.users,), workload=workload, requests_per_user=args.requests_per_user,
                              repeats=args.repeats)
            plan = RunPlan(engines=FACES, load=load, engine=config)
            result = RunResult(plan=plan, model_path=model_path,
                               engine_info={n: e.info for n, e in engines.items()})
            await execute(plan, engines, tokenizer, result)
            write_run(result, Path(args.out) / workload)
            rows += face_rows(summary_dict(result))
            print(json.dumps(rows[-2 * args.repeats:], indent=1), flush=True)
    finally:
        for engine in engines.values():
            await engine.stop()
    (Path(args.out) / "faces.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parse())))
