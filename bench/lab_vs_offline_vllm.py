"""vLLM's two faces and its ceiling, taking turns in one run: offline LLM.generate, the lab's engine mode
(vllm-engine: LLMEngine.step() fed by closed-loop users), the lab's served mode (vllm: AsyncLLM streaming) and a
bare AsyncLLM client (N concurrent generate() streams, no lab code).

Every face is started at once, each with its own KV pool (--kv-cache-gib), then they take turns for --rounds
rounds, the order turned by one each round; every turn sends the same requests all at once (users = requests)
after a prefix-cache reset. A machine whose speed drifts (a lent GPU host moved one offline call by +-20% from
run to run) moves the faces of a round together, so the ratios are taken round by round and printed as a
geometric mean with a 95% t-interval: engine mode / offline (issue #9's goal: >= 0.9) and served / bare AsyncLLM.
Same model, same prompts, exact output lengths, greedy, token ids only.
Usage: python -m bench.lab_vs_offline_vllm [--requests 64] [--output-len 64] [--rounds 6]
       [--faces offline,engine,served,bare] [--device cuda] [--model FOLDER] [--load-format dummy] [--kv-cache-gib 8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import statistics
import time
from dataclasses import replace
from pathlib import Path

from bench.paired import geometric_interval, interval_text, rotated
from lab.__main__ import add_engine_args, engine_config_from
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.runs import level_requests
from lab.session import LabSession

GOAL = 0.90  # engine mode / offline, all requests at once
CUDA_KV_GIB = 8.0  # each face's KV pool on a GPU unless --kv-cache-gib says: all faces must fit at once
SETTLE_S = {"cpu": 1.5, "cuda": 0.2}  # a pause between turns (vLLM's CPU worker spins ~1 s after its requests)
FACES = ("offline", "engine", "served", "bare")
PAIRS = (("engine", "offline"), ("served", "bare"))
LABELS = {"offline": "offline LLM.generate, all at once",
          "engine": "lab vllm-engine (step loop), closed-loop users",
          "served": "lab vllm (AsyncLLM streaming), closed-loop users",
          "bare": "bare AsyncLLM client, concurrent streams"}


def at_once_plan(args, engine: str) -> RunPlan:
    """All requests at once: one closed-loop user per request, one request each."""
    return RunPlan(engines=(engine,), load=LoadConfig(
        users=(args.requests,), requests_per_user=1, workload=args.workload, output_len=args.output_len,
        warmup_requests=2))


def _prompts_and_params(requests, delta: bool = False):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
    return ([TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests],
            [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0, output_kind=kind,
                            detokenize=False) for r in requests])  # token ids only, as the lab asks


class Offline:
    """LLM.generate over every request at once (vLLM's stats off, as LLM has them by default)."""

    def __init__(self, config: EngineConfig, model_path: str, requests):
        self.config, self.model_path, self.requests, self.llm = config, model_path, requests, None

    async def start(self) -> None:
        from vllm import LLM

        from lab.engines.vllm import engine_kwargs

        kwargs = engine_kwargs(self.config, self.model_path)
        kwargs.pop("disable_log_stats", None)
        self.llm = LLM(**kwargs)
        self.prompts, self.params = _prompts_and_params(self.requests)
        self.llm.generate(self.prompts[:2], self.params[:2], use_tqdm=False)

    async def run(self) -> float:
        self.llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)

    async def stop(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()


class LabFace:
    """One of the lab's vLLM engines through LabSession, as the CLI runs it."""

    def __init__(self, config: EngineConfig, args, engine: str):
        self.config, self.plan, self.engine, self.session = config, at_once_plan(args, engine), engine, None

    async def start(self) -> None:
        self.session = LabSession(self.config, (self.engine,))
        await self.session.start()

    async def run(self) -> float:
        result = await self.session.run(self.plan)
        return result.levels[0].summary.output_tok_s

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.stop()


class BareAsync:
    """Every request as its own AsyncLLM.generate() stream (DELTA), all at once: no lab code at all."""

    def __init__(self, config: EngineConfig, model_path: str, requests):
        self.config, self.model_path, self.requests, self.engine = config, model_path, requests, None
        self.ids = itertools.count()

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from lab.engines.vllm import engine_kwargs

        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(self.config, self.model_path)))
        self.prompts, self.params = _prompts_and_params(self.requests, delta=True)
        await asyncio.gather(self.one(0), self.one(1))

    async def one(self, index: int) -> int:
        made = 0
        async for output in self.engine.generate(self.prompts[index], self.params[index], f"bare-{next(self.ids)}"):
            made += len(output.outputs[0].token_ids)
        return made

    async def run(self) -> float:
        await self.engine.reset_prefix_cache()
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(self.one(i) for i in range(len(self.requests)))))
        return tokens / (time.perf_counter() - start)

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


def make_faces(config: EngineConfig, args, model_path: str, requests) -> dict:
    """The faces asked for by --faces, not yet started."""
    made = {"offline": lambda: Offline(config, model_path, requests),
            "engine": lambda: LabFace(config, args, "vllm-engine"),
            "served": lambda: LabFace(config, args, "vllm"),
            "bare": lambda: BareAsync(config, model_path, requests)}
    return {name: made[name]() for name in args.faces}


async def take_turns(faces: dict, rounds: int, settle_s: float) -> dict[str, list[float]]:
    """Start every face, then --rounds rounds of one turn each, the order turned each round; stop them all."""
    rates: dict[str, list[float]] = {name: [] for name in faces}
    try:
        for name, face in faces.items():
            logging.info("starting %s", name)
            await face.start()
        for round_ in range(rounds):
            for name in rotated(list(faces), round_):
                await asyncio.sleep(settle_s)
                rates[name].append(await faces[name].run())
            logging.info("round %d: %s", round_ + 1, {name: round(r[-1]) for name, r in rates.items()})
    finally:
        for face in faces.values():
            await face.stop()
    return rates


def report(rates: dict[str, list[float]], heading: str) -> list[str]:
    """Each face's rate per round and mean, then the paired ratios."""
    lines = [heading, f"{'face':<48} {'mean tok/s':>10}   per round"]
    for name, values in rates.items():
        lines.append(f"{LABELS[name]:<48} {statistics.fmean(values):>10.0f}   " + " ".join(f"{r:.0f}" for r in values))
    lines.append("paired, round by round (geometric mean [95% t-interval]):")
    for top, bottom in PAIRS:
        if top in rates and bottom in rates:
            ratios = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
            lines.append(f"  {top} / {bottom}: {interval_text(ratios)}" + verdict(top, bottom, ratios))
    return lines


def heading(args, config: EngineConfig, model_path: str) -> str:
    from lab.engines.vllm import kv_budget_bytes

    return (f"{args.requests} requests at once, {args.workload}, {args.output_len} output tokens each, "
            f"{config.resolved_device()}, {model_path}, KV pool {kv_budget_bytes(config) / 2**30:g} GiB per face; "
            f"{args.rounds} rounds, the order turned each round")


def read_rates(path: str) -> dict[str, list[float]]:
    """The per-round rates of a saved report, by face."""
    rates = {}
    for line in Path(path).read_text().splitlines():
        for name, label in LABELS.items():
            if line.startswith(label):
                rates[name] = [float(value) for value in line[len(label):].split()[1:]]
    return rates


def pooled(paths: list[str]) -> dict[str, list[float]]:
    """Saved reports' rounds as one run (the faces all of them have)."""
    found = [read_rates(path) for path in paths]
    common = [name for name in FACES if all(name in rates for rates in found)]
    return {name: [value for rates in found for value in rates[name]] for name in common}


def verdict(top: str, bottom: str, ratios: list[float]) -> str:
    """Issue #9's goal on engine mode / offline, said on the mean."""
    if (top, bottom) != ("engine", "offline"):
        return ""
    mean, low, _ = geometric_interval(ratios)
    said = "met" if mean >= GOAL else "NOT met"
    sure = "" if low is None else (", and by the whole interval" if low >= GOAL else ", not by the whole interval")
    return f"   goal >= {GOAL}: {said} on the mean{sure if mean >= GOAL else ''}"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(parser)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pool", nargs="+", metavar="REPORT", default=None,
                        help="table saved reports of this bench as one run (their rounds pooled); runs nothing")
    parser.add_argument("--faces", default=",".join(FACES), type=lambda text: tuple(text.split(",")),
                        help=f"which of {','.join(FACES)} take turns (an 8B shape on one H100: offline,engine)")
    args = parser.parse_args()
    unknown = sorted(set(args.faces) - set(FACES))
    if unknown:
        parser.error(f"--faces takes {','.join(FACES)}, not {','.join(unknown)}")
    if min(args.rounds, args.requests) < 1:
        parser.error(f"--rounds ({args.rounds}) and --requests ({args.requests}) must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.pool:
        rates = pooled(args.pool)
        print("\n".join(report(rates, f"{len(args.pool)} reports pooled: {len(next(iter(rates.values())))} rounds")))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = engine_config_from(args)
    if config.resolved_device() == "cuda" and config.kv_cache_gib is None:
        config = replace(config, kv_cache_gib=CUDA_KV_GIB)
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    model_path = resolve_model(args.model)
    plan = at_once_plan(args, "vllm")
    requests = list(level_requests(AutoTokenizer.from_pretrained(model_path), plan, args.requests))
    faces = make_faces(config, args, model_path, requests)
    rates = asyncio.run(take_turns(faces, args.rounds, SETTLE_S[config.resolved_device()]))
    print("\n" + "\n".join(report(rates, heading(args, config, model_path))))


if __name__ == "__main__":
    main()
