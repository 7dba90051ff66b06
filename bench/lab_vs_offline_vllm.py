"""vLLM's two faces and its ceiling, taking turns in one run: offline LLM.generate, the lab's engine mode
(vllm-engine: LLMEngine.step() fed by closed-loop users), the lab's served mode (vllm: AsyncLLM streaming) and a
bare AsyncLLM client (N concurrent generate() streams, no lab code).

Every face is started at once, each with its own KV pool (--kv-cache-gib), then they take turns for --rounds
rounds. Every turn warms its face with the lab's two short warm-up requests, resets the prefix cache and sends
the same requests all at once (users = requests). The order turns by one every two rounds and runs backwards on
odd rounds, so over 2 x faces rounds each face goes first as often as the others and before each other face
half the time: a drifting machine favours none. Offline and the bare client get the step token budget the lab's
engines got (max_num_batched_tokens; vLLM's LLM class defaults to a larger one). Printed: each face's rates,
engine mode / offline and served / offline (the goal: >= GOAL) and served / bare AsyncLLM as geometric means of
the rounds' ratios with a 95% t-interval (the spread is mostly per call, so more rounds narrow it). Same model,
same prompts, exact output lengths, greedy, token ids only.
--trace also prints where each face's level time went, from what its front end got from vLLM's engine core:
when the first token came, how many steps ran and how long each took, how late the front end took each step's
output, and what followed the last one.
Usage: python -m bench.lab_vs_offline_vllm [--requests 64] [--workload mixed] [--output-len N] [--rounds 8]
       [--faces offline,engine,served,bare] [--trace] [--device cuda] [--model FOLDER] [--load-format dummy]
       [--kv-cache-gib 8]
       python -m bench.lab_vs_offline_vllm --pool REPORT... (saved reports' rounds as one run)
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

from bench.paired import geometric_interval, interval_text, turn_order
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.options import add_engine_args, engine_config_from
from lab.runs import level_requests, warmup_requests
from lab.session import LabSession, settle_heap

log = logging.getLogger(__name__)
GOAL = 0.95  # a lab face / offline, all requests at once
CUDA_KV_GIB = 8.0  # each face's KV pool on a GPU unless --kv-cache-gib says: all faces must fit at once
SETTLE_S = {"cpu": 1.5, "cuda": 0.2}  # a pause between turns (vLLM's CPU worker spins ~1 s after its requests)
FACES = ("offline", "engine", "served", "bare")
LAB_ENGINES = {"engine": "vllm-engine", "served": "vllm"}
PAIRS = (("engine", "offline"), ("served", "offline"), ("served", "bare"))
LABELS = {"offline": "offline LLM.generate, all at once",
          "engine": "lab vllm-engine (step loop), closed-loop users",
          "served": "lab vllm (AsyncLLM streaming), closed-loop users",
          "bare": "bare AsyncLLM client, concurrent streams"}
POOLED = "reports pooled"  # the heading of a pooled report, which --pool leaves out


def at_once_plan(args, engine: str) -> RunPlan:
    """All requests at once: one closed-loop user per request, one request each, after the lab's warm-up."""
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
    """Every request at once into LLMEngine, stepped as LLM.generate steps it (lab.engines.vllm_offline; vLLM's
    stats off, as LLM has them by default)."""

    def __init__(self, config: EngineConfig, model_path: str, requests, warmup):
        self.config, self.model_path, self.requests, self.warmup = config, model_path, requests, warmup
        self.engine, self.budget = None, None

    async def start(self) -> None:
        from lab.engines.vllm_offline import offline_engine

        self.engine = offline_engine(vllm_kwargs(self.config, self.model_path, self.budget, stats=False))
        self.prompts, self.params = _prompts_and_params(self.requests)
        self.warm = _prompts_and_params(self.warmup)

    async def run(self) -> float:
        from lab.engines.vllm_offline import generate_all

        generate_all(self.engine, *self.warm)
        start = time.perf_counter()
        tokens, seconds = generate_all(self.engine, self.prompts, self.params)
        self.window = (start, time.perf_counter())
        return tokens / seconds

    def core_client(self):
        return self.engine.engine_core

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.engine_core.shutdown()


class LabFace:
    """One of the lab's vLLM engines through LabSession, as the CLI runs it."""

    def __init__(self, config: EngineConfig, args, engine: str):
        self.config, self.plan, self.engine, self.session = config, at_once_plan(args, engine), engine, None

    async def start(self) -> None:
        self.session = LabSession(self.config, (self.engine,))
        await self.session.start()

    def step_budget(self) -> int:
        """The step token budget (max_num_batched_tokens) vLLM gave this engine."""
        return self.session.info[self.engine].args["max_num_batched_tokens"]

    async def run(self) -> float:
        from lab.metrics import level_window_s

        level = (await self.session.run(self.plan)).levels[0]
        self.window = level_window_s(level.records)
        return level.summary.output_tok_s

    def core_client(self):
        return self.session.engines[self.engine]._engine.engine_core

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.stop()


class BareAsync:
    """Every request as its own AsyncLLM.generate() stream (DELTA), all at once: no lab code at all."""

    def __init__(self, config: EngineConfig, model_path: str, requests, warmup):
        self.config, self.model_path, self.requests, self.warmup = config, model_path, requests, warmup
        self.engine, self.budget, self.ids = None, None, itertools.count()

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from lab.engines.vllm import engine_args

        kwargs = vllm_kwargs(self.config, self.model_path, self.budget, stats=True)
        self.engine = AsyncLLM.from_engine_args(engine_args(AsyncEngineArgs, kwargs))
        self.prompts, self.params = _prompts_and_params(self.requests, delta=True)  # built once, untimed
        self.warm = _prompts_and_params(self.warmup, delta=True)

    async def all_at_once(self, prompts, params) -> int:
        async def one(prompt, param) -> int:
            made = 0
            async for output in self.engine.generate(prompt, param, f"bare-{next(self.ids)}"):
                made += len(output.outputs[0].token_ids)
            return made

        return sum(await asyncio.gather(*map(one, prompts, params)))

    async def run(self) -> float:
        await self.all_at_once(*self.warm)
        await self.engine.reset_prefix_cache()
        start = time.perf_counter()
        tokens = await self.all_at_once(self.prompts, self.params)
        self.window = (start, time.perf_counter())
        return tokens / (self.window[1] - start)

    def core_client(self):
        return self.engine.engine_core

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


class CoreTrace:
    """What one face's front end got from vLLM's engine core: each output's time stamp in the core (CLOCK_MONOTONIC,
    which time.perf_counter reads too, one clock for every process of this host), when the front end took it, and
    how many requests it carried tokens for. Steps whose output carried no token (a prefill chunk) are not seen."""

    def __init__(self, client):
        self.got: list[tuple[float, float, int]] = []
        name = "get_output_async" if "Async" in type(client).__name__ else "get_output"
        original = getattr(client, name)

        def keep(outputs):
            self.got.append((outputs.timestamp, time.perf_counter(), len(outputs.outputs)))
            return outputs

        async def taken_async():
            return keep(await original())

        setattr(client, name, taken_async if name.endswith("async") else lambda: keep(original()))

    def turn(self, window: tuple[float, float] | None) -> dict:
        """One turn's figures in seconds, from the outputs with tokens that came within its window (then
        forgotten); none for a turn of fewer than two such outputs."""
        rows = [row for row in self.got if row[2] and window and window[0] <= row[1] <= window[1] + 0.001]
        self.got = []
        if len(rows) < 2:
            return {}
        start, end = window
        stamps = [row[0] for row in rows]
        return {"wall": end - start, "first token": stamps[0] - start, "steps": len(rows),
                "step": statistics.median(b - a for a, b in itertools.pairwise(stamps)),
                "lag p50": statistics.median(got - ts for ts, got, _ in rows),
                "lag max": max(got - ts for ts, got, _ in rows), "after last": end - stamps[-1],
                "requests/step": statistics.fmean(row[2] for row in rows)}


TRACE_MS = ("wall", "first token", "step", "lag p50", "lag max", "after last")


def trace_report(traced: dict[str, list[dict]]) -> list[str]:
    """Each face's trace figures, the median over its traced turns (times in ms)."""
    keys = next((list(turn) for turns in traced.values() for turn in turns if turn), [])
    lines = ["where each face's level time went (median of its turns; ms, but steps and requests/step):",
             f"{'face':<8}" + "".join(f"{key:>14}" for key in keys)]
    for name, turns in traced.items():
        seen = [turn for turn in turns if turn]
        cells = "".join(f"{statistics.median(t[key] for t in seen) * (1000 if key in TRACE_MS else 1):>14.1f}"
                        for key in keys) if seen else "  no turn traced"
        lines.append(f"{name:<8}{cells}")
    return lines


def vllm_kwargs(config: EngineConfig, model_path: str, budget: int | None, stats: bool) -> dict:
    """The lab's vLLM engine args, with the lab engines' step token budget where one was read."""
    from lab.engines.vllm import engine_kwargs

    kwargs = engine_kwargs(config, model_path)
    kwargs["disable_log_stats"] = not stats
    if budget is not None:
        kwargs["max_num_batched_tokens"] = budget
    return kwargs


def make_faces(config: EngineConfig, args, model_path: str, requests, warmup) -> dict:
    """The faces asked for by --faces, not yet started, the lab's first (the others take their step budget)."""
    made = {"offline": lambda: Offline(config, model_path, requests, warmup),
            "engine": lambda: LabFace(config, args, LAB_ENGINES["engine"]),
            "served": lambda: LabFace(config, args, LAB_ENGINES["served"]),
            "bare": lambda: BareAsync(config, model_path, requests, warmup)}
    return {name: made[name]() for name in sorted(args.faces, key=lambda name: name not in LAB_ENGINES)}


async def start_all(faces: dict) -> None:
    """Start the faces in order; offline and bare get the first lab engine's step budget."""
    budget = None
    for name, face in faces.items():
        log.info("starting %s", name)
        if name not in LAB_ENGINES:
            face.budget = budget
        await face.start()
        if name in LAB_ENGINES and budget is None:
            budget = face.step_budget()
    settle_heap()  # as the CLI does after its start
    log.info("step token budget (max_num_batched_tokens) of every face: %s", budget or "vLLM's default")


async def take_turns(faces: dict, rounds: int, settle_s: float, traced: dict | None = None) -> dict[str, list[float]]:
    """Start every face, then --rounds rounds of one turn each (turn_order); stop them all, whatever happened.
    With ``traced`` (a dict), each face's turns' trace figures go into it by face."""
    rates: dict[str, list[float]] = {name: [] for name in faces}
    try:
        await start_all(faces)
        traces = {name: CoreTrace(face.core_client()) for name, face in faces.items()} if traced is not None else {}
        for round_ in range(rounds):
            for name in turn_order(list(faces), round_):
                await asyncio.sleep(settle_s)
                rates[name].append(await faces[name].run())
                if name in traces:
                    traced.setdefault(name, []).append(traces[name].turn(faces[name].window))
            log.info("round %d: %s", round_ + 1, {name: round(r[-1]) for name, r in rates.items()})
    finally:
        await stop_all(faces)
    return rates


async def stop_all(faces: dict) -> None:
    """Stop every face; one that fails to stop does not keep the others running."""
    for name, face in faces.items():
        try:
            await face.stop()
        except Exception:  # the next face must still stop
            log.exception("stopping %s failed", name)


def report(rates: dict[str, list[float]], heading: str) -> list[str]:
    """Each face's rate per round and mean, then the paired ratios."""
    lines = [heading, f"{'face':<48} {'mean tok/s':>10}   per round"]
    for name, values in rates.items():
        lines.append(f"{LABELS[name]:<48} {statistics.fmean(values):>10.1f}   " + " ".join(f"{r:.1f}" for r in values))
    lines.append("paired, round by round (geometric mean [95% t-interval]):")
    for top, bottom in PAIRS:
        if top in rates and bottom in rates:
            ratios = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
            lines.append(f"  {top} / {bottom}: {interval_text(ratios)}" + verdict(top, bottom, ratios))
    return lines


def verdict(top: str, bottom: str, ratios: list[float]) -> str:
    """The goal (GOAL) on a lab face / offline, said on the mean and on the interval's low end."""
    if bottom != "offline":
        return ""
    mean, low, _ = geometric_interval(ratios)
    if mean < GOAL:
        return f"   goal >= {GOAL}: NOT met"
    return f"   goal >= {GOAL}: met on the mean" + ("" if low is None else (
        ", and by the whole interval" if low >= GOAL else ", not by the whole interval"))


def heading(args, config: EngineConfig, model_path: str) -> str:
    from lab.memory import kv_budget_bytes

    lengths = f"{args.output_len} output tokens each" if args.output_len else "the workload's output lengths"
    return (f"{args.requests} requests at once, {args.workload}, {lengths}, "
            f"{config.resolved_device()}, {model_path}, KV pool {kv_budget_bytes(config) / 2**30:g} GiB per face; "
            f"{args.rounds} rounds, turns in a balanced order")


def read_rates(path: str) -> dict[str, list[float]]:
    """The per-round rates of a saved report, by face; a pooled report gives none (its rounds are elsewhere)."""
    lines = Path(path).read_text().splitlines()
    if lines and POOLED in lines[0]:
        log.warning("%s is a pooled report: left out", path)
        return {}
    rates = {}
    for line in lines:
        for name, label in LABELS.items():
            if line.startswith(label):
                rates[name] = [float(value) for value in line[len(label):].split()[1:]]
    return rates


def pooled(paths: list[str]) -> dict[str, list[float]]:
    """Saved reports' rounds as one run: the faces every report has (reports without faces are left out)."""
    found = [rates for rates in map(read_rates, paths) if rates]
    common = [name for name in FACES if found and all(name in rates for rates in found)]
    return {name: [value for rates in found for value in rates[name]] for name in common}


def pool(paths: list[str]) -> None:
    """--pool: print the saved reports' rounds as one table, or say why there is none."""
    missing = [path for path in paths if not Path(path).is_file()]
    if missing:
        raise SystemExit(f"--pool: no such report: {', '.join(missing)}")
    rates = pooled(paths)
    if not rates:
        raise SystemExit("--pool: these files hold no face that every one of them has (are they reports of this "
                         "bench, and not pooled ones?)")
    print("\n".join(report(rates, f"{len(paths)} {POOLED}: {len(next(iter(rates.values())))} rounds")))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(parser)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=None, help="every output this long (default: the "
                        "workload's lengths)")
    parser.add_argument("--trace", action="store_true", help="also print where each face's level time went")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--rounds", type=int, default=8, help="best a multiple of 2 x faces (the turns balance)")
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
    try:
        at_once_plan(args, "vllm")  # the lab's own rules for a load, before anything loads
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main() -> None:
    args = parse_args()
    if args.pool:
        return pool(args.pool)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = engine_config_from(args)
    if config.resolved_device() == "cuda" and config.kv_cache_gib is None:
        config = replace(config, kv_cache_gib=CUDA_KV_GIB)
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    plan = at_once_plan(args, "vllm")
    requests = list(level_requests(tokenizer, plan, args.requests))
    faces = make_faces(config, args, model_path, requests, warmup_requests(tokenizer, plan, "bench"))
    traced = {} if args.trace else None
    rates = asyncio.run(take_turns(faces, args.rounds, SETTLE_S[config.resolved_device()], traced))
    print("\n" + "\n".join(report(rates, heading(args, config, model_path)) + (trace_report(traced) if traced else [])))


if __name__ == "__main__":
    main()
