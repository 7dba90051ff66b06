"""Probe (kept in docs/results as it ran): where vllm-engine's time goes against offline LLM.generate, on one GPU.

Variants, each its own engine, ROUNDS timed runs of 64 requests at once:
offline with vLLM's stats off (LLM's default) and on; the lab's engine mode as before this change (all of
vLLM's stat loggers, one chunk per step), with only the lab's sampler, and with merged hand-overs too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import time
from dataclasses import dataclass, field

import lab.engines.vllm_engine as ve
from bench.lab_vs_offline_vllm import _prompts_and_params, plans, wait_for_memory
from lab.config import EngineConfig
from lab.engines.base import TokenChunk
from lab.runs import level_requests
from lab.session import LabSession

NEW_SLOT, NEW_KEEP = ve.StepSlot, ve.keep_lab_sampler


@dataclass
class OldSlot(ve.StepSlot):
    chunks: list = field(default_factory=list)

    def stamp(self, token_ids, now):
        self.chunks.append(TokenChunk(now, tuple(token_ids)))

    def pending(self):
        return bool(self.chunks) or self.last is not None

    def take(self):
        items, self.chunks = self.chunks, []
        if self.last is not None:
            items.append(self.last)
        return items


SEEN: list = []  # (core timestamp, receive time, outputs) of every get_output, last round


def watch(client) -> None:
    get = client.get_output

    def timed_get():
        a = time.perf_counter()
        out = get()
        Timed.totals["get_s"] = Timed.totals.get("get_s", 0) + time.perf_counter() - a
        SEEN.append((out.timestamp, time.monotonic(), len(out.outputs)))
        return out

    client.get_output = timed_get


def core_summary() -> str:
    busy = [s for s in SEEN if s[2]]
    if len(busy) < 3:
        return ""
    gaps = sorted(b[0] - a[0] for a, b in zip(busy, busy[1:]))
    lags = sorted(r - t for t, r, _ in busy)
    return (f"core step p50 {1e3 * gaps[len(gaps) // 2]:.2f} mean {1e3 * (busy[-1][0] - busy[0][0]) / len(gaps):.2f} ms; "
            f"lag p50 {1e3 * lags[len(lags) // 2]:.2f} max {1e3 * lags[-1]:.1f} last {1e3 * (busy[-1][1] - busy[-1][0]):.1f} ms")


class Timed(ve.StepLoop):
    totals: dict = {}

    def run(self):
        t = Timed.totals
        core = self.core.engine_core
        watch(core)
        while not self.stopping:
            self.admit()
            if not self.core.has_unfinished_requests():
                self.wait_for_work()
                continue
            q = getattr(core, "outputs_queue", None)
            t["backlog"] = t.get("backlog", 0) + (q is not None and q.qsize() > 0)
            a = time.perf_counter()
            outputs = self.core.step()
            b = time.perf_counter()
            self.deliver(outputs, b)
            self.flush()
            c = time.perf_counter()
            t["steps"] = t.get("steps", 0) + 1
            t["step_s"] = t.get("step_s", 0) + b - a
            t["deliver_s"] = t.get("deliver_s", 0) + c - b


ve.StepLoop = Timed


def offline(config, model_path, requests, stats: bool, rounds: int) -> list[float]:
    from vllm import LLM

    from lab.engines.vllm import engine_kwargs

    kwargs = engine_kwargs(config, model_path)
    kwargs["disable_log_stats"] = not stats
    llm = LLM(**kwargs)
    prompts, params = _prompts_and_params(requests)
    llm.generate(prompts[:2], params[:2], use_tqdm=False)
    watch(llm.llm_engine.engine_core)
    rates = []
    for _ in range(rounds):
        SEEN.clear()
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return rates


async def engine_mode(config, args, old_slots: bool, keep_all: bool, rounds: int,
                      switch_s: float = 0.005) -> tuple[list, dict]:
    sys.setswitchinterval(switch_s)
    ve.StepSlot = OldSlot if old_slots else NEW_SLOT
    ve.keep_lab_sampler = (lambda engine: None) if keep_all else NEW_KEEP
    Timed.totals = {}
    session = LabSession(config, ("vllm-engine",))
    await session.start()
    rates = []
    try:
        plan = plans(args, "vllm-engine")[0]
        for _ in range(rounds):
            Timed.totals.clear()
            SEEN.clear()
            result = await session.run(plan)
            rates.append(result.levels[0].summary.output_tok_s)
        return rates, dict(Timed.totals)
    finally:
        await session.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = EngineConfig(model=args.model, device=args.device, load_format=args.load_format)
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    model_path = resolve_model(args.model)
    plan = plans(args, "vllm")[0]
    at_once = list(level_requests(AutoTokenizer.from_pretrained(model_path), plan, plan.load.users[0]))
    variants = {
        "offline, stats off": lambda: (offline(config, model_path, at_once, False, args.rounds), {}),
        "engine, all loggers, chunk/step": lambda: asyncio.run(engine_mode(config, args, True, True, args.rounds)),
        "engine, sampler only, merged": lambda: asyncio.run(engine_mode(config, args, False, False, args.rounds)),
        "offline, stats on": lambda: (offline(config, model_path, at_once, True, args.rounds), {}),
        "engine, merged, switch 0.5ms": lambda: asyncio.run(engine_mode(config, args, False, False, args.rounds,
                                                                        0.0005)),
        "offline, stats off (again)": lambda: (offline(config, model_path, at_once, False, args.rounds), {}),
    }
    for name, run in variants.items():
        if args.only and args.only not in name:
            continue
        rates, t = run()
        wait_for_memory(config)
        steps = t.get("steps", 0) or 1
        extra = (f"steps {t.get('steps', 0)}, step() {1e3 * t.get('step_s', 0) / steps:.2f} ms "
                 f"(get_output {1e3 * t.get('get_s', 0) / steps:.2f}), deliver+flush "
                 f"{1e3 * t.get('deliver_s', 0) / steps:.3f} ms, backlog {t.get('backlog', 0) / steps:.0%}"
                 if t else "")
        print(f"{name:<36} {' '.join(f'{r:9.0f}' for r in rates)}   {extra}", flush=True)
        print(f"{'':<36} {core_summary()}", flush=True)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
