"""The headless CLI: ``bench`` measures, ``check`` compares the engines' text, ``env`` and ``setup-model``.

    python -m lab bench --engines hf,vllm --users 1,5,10,20 --workload mixed --out results/demo

prints a progress bar and a table, and writes DIR/summary.json and DIR/requests.csv (also when the
run fails or is interrupted: what was measured is kept). Exit codes: 0 ok, 1 failed or cancelled
(files written), 2 bad input (nothing loaded).

    python -m lab check [--json]

loads both engines, decodes the agreement prompts greedily on each and prints how far they agree;
exit 0 when they agree (or the check is skipped for dummy weights), 1 when not, 2 on bad input.

    python -m lab experiment waste --out results/waste [--param users=5 ...]

runs one KV-cache experiment (lab/experiments/) and writes DIR/experiment.json (+ experiment.csv),
also when it fails or is interrupted; exit codes as for bench.

    python -m lab sweep max_num_seqs --values 1,4,16 --users 5 --out results/sweep

restarts the knob's engine once per value and runs the same seeded requests on it; writes
DIR/sweep.json and DIR/sweep.csv (finished values kept on failure or Ctrl-C); exit codes as for bench.

    python -m lab capacity --slo ttft_p95=2s,tpot_p95=150ms --engines hf,vllm --out results/capacity

raises each engine's users geometrically until the target fails, then bisects to the most users that meet it
(--rate-search: the largest open-loop request rate); writes DIR/capacity.json after every probe and
DIR/requests.csv, and stores the result; exit codes as for bench (a search stopped by --time-limit is 0, said so).

    python -m lab report DIR_OR_ID --out report.html     # or: python -m lab report --list

writes one self-contained HTML file of a run, an experiment (the why ladder too) or a sweep: the page's figures,
the computed sentences, tables, parameters, engine args, device and versions; --list prints the stored ids.
vLLM's own log lines go to stderr, so that stdout holds only what the command prints. Every task command (bench,
experiment, explain, sweep, capacity) goes through one runner (``run_jobs``) and is stored in the results database
as it goes, as the page stores its tasks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab import LOG_FORMAT
from lab.config import (
    API_KEY_ENV,
    MAX_RATE,
    MAX_REPEATS,
    MAX_REQUESTS,
    MAX_USERS,
    EngineConfig,
    LoadConfig,
    RunPlan,
    parse_slo,
    parse_users,
)
from lab.engines import registry
from lab.experiments import EXPERIMENTS
from lab.experiments.ladder import RUNGS
from lab.load.workloads import WORKLOADS
from lab.metrics import ratio_pairs, ratio_spreads
from lab.options import add_engine_args, add_engines_arg, engine_config_from, engines_from, number_arg, whole_arg
from lab.status import RunStatus
from lab.sweeps import KNOBS
from lab.tasks import spec_of

log = logging.getLogger("lab")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: the task commands (bench, experiment, explain, sweep, capacity: each a job for run_jobs),
    check, serve, report, env and setup-model, each with the engine options (lab.options)."""
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="load-test HF and vLLM side by side")
    add_engines_arg(bench)
    bench.add_argument("--rate", type=number_arg, default=None,
                       help="open loop: requests per second, sent on schedule; --users is then the cap in flight")
    bench.add_argument("--arrival", default="poisson", choices=("poisson", "constant", "gamma"),
                       help="open loop's arrival process (gamma: set --burstiness)")
    bench.add_argument("--burstiness", type=number_arg, default=1.0,
                       help="gamma shape: < 1 bursty, 1 Poisson, > 1 even")
    bench.add_argument("--slo", default="", help="latency targets for goodput, e.g. ttft=0.5,tpot=0.05 (seconds)")
    bench.add_argument("--users", default="1,5,10,20", help="concurrent-user levels, e.g. 1,5,10,20")
    bench.add_argument("--workload", default="mixed", help=f"one of {', '.join(WORKLOADS)}")
    bound = bench.add_mutually_exclusive_group()
    bound.add_argument("--requests-per-user", type=whole_arg, default=None,
                       help="measured requests per user (default 2)")
    bound.add_argument("--duration", type=number_arg, default=None, help="seconds per level instead of a count")
    bench.add_argument("--output-len", type=whole_arg, default=None, help="force every output length")
    bench.add_argument("--think-time", type=number_arg, default=1.0,
                       help="chat workload: a user's pause in seconds between a reply and its next turn (default 1)")
    bench.add_argument("--no-exact", action="store_true", help="let requests stop at EOS")
    bench.add_argument("--warmup", type=whole_arg, default=2, help="unmeasured warm-up requests per engine")
    bench.add_argument("--seed", type=whole_arg, default=0)
    bench.add_argument("--repeats", type=whole_arg, default=1,
                       help=f"run each level this many times per engine and report the spread (1-{MAX_REPEATS})")
    bench.add_argument("--max-users", type=whole_arg, default=MAX_USERS,
                       help=f"refuse levels past this many users (default {MAX_USERS})")
    bench.add_argument("--max-requests", type=whole_arg, default=MAX_REQUESTS,
                       help=f"refuse levels past this many requests (default {MAX_REQUESTS})")
    bench.add_argument("--out", default="results/latest", help="folder for summary.json and requests.csv")
    add_engine_args(bench)
    setup = sub.add_parser("setup-model", help="build the embedded SmolLM2 folder once and print its path")
    setup.add_argument("--verbose", action="store_true")
    check = sub.add_parser("check", help="do HF and vLLM compute the same greedy text? (exit 1 if not)")
    check.add_argument("--json", action="store_true", help="print the agreement as JSON")
    add_engines_arg(check)
    add_engine_args(check)
    exp = sub.add_parser("experiment", help="run one KV-cache experiment (why paged KV wins)")
    exp.add_argument("name", help="one of: " + ", ".join(EXPERIMENTS))
    exp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="an experiment parameter (repeatable), e.g. users=5 or users=1,5,10")
    exp.add_argument("--out", default=None, help="folder for experiment.json (default results/NAME)")
    add_engine_args(exp)
    explain = sub.add_parser("explain", help="why is vLLM faster here? its ratio taken apart, one mechanism per rung")
    explain.add_argument("--preset", default="overhead",
                         help="overhead, spread or memory: the load the rungs share (a comma list runs each in turn, "
                              "the rung engines kept loaded, into DIR/PRESET/)")
    explain.add_argument("--repeats", type=whole_arg, default=3,
                         help=f"turns of every rung, interleaved (1-{MAX_REPEATS})")
    explain.add_argument("--rungs", default=",".join(RUNGS), help="comma list of rungs (hf and vllm at least)")
    explain.add_argument("--users", default="", help="user levels to run the whole ladder at, e.g. 1,8,64 (default: "
                         "the preset's own level; the Why tab's default is 1,4 on a CPU, 1,8,64 on a GPU)")
    explain.add_argument("--out", default="results/explain", help="folder for explain.json and explain.csv")
    add_engine_args(explain)
    sweep = sub.add_parser("sweep", help="one engine knob over several values (one engine restart each)")
    sweep.add_argument("knob", help="one of: " + ", ".join(KNOBS))
    sweep.add_argument("--values", required=True, help="comma list, e.g. 1,4,16,64")
    sweep.add_argument("--users", default="5", help="concurrent-user levels run at every value")
    sweep.add_argument("--workload", default="mixed", help=f"one of {', '.join(WORKLOADS)}")
    sweep.add_argument("--requests-per-user", type=whole_arg, default=2)
    sweep.add_argument("--output-len", type=whole_arg, default=None, help="force every output length")
    sweep.add_argument("--out", default=None, help="folder for sweep.json and sweep.csv (default results/sweep-KNOB)")
    add_engine_args(sweep)
    add_capacity_parser(sub)
    serve = sub.add_parser("serve", help="serve the model over OpenAI's API (vLLM's or transformers' server)")
    serve.add_argument("--engine", default="vllm", choices=("vllm", "hf"),
                       help="vllm: vLLM's OpenAI server (with /metrics); hf: transformers serve, continuous batching")
    serve.add_argument("--port", type=whole_arg, default=8000, help="port on 127.0.0.1 (0: any free one)")
    add_engine_args(serve)
    report = sub.add_parser("report", help="one self-contained HTML file of a run, experiment, sweep or capacity "
                                           "search (opens with no network)")
    report.add_argument("run", metavar="DIR_OR_ID", nargs="?",
                        help="a folder bench, experiment, explain, sweep or capacity wrote, or a stored result's id")
    report.add_argument("--out", default="report.html", help="the HTML file to write")
    report.add_argument("--list", action="store_true", help="print the stored results' ids, newest first, and exit")
    env = sub.add_parser("env", help="print the device, versions and memory plan as JSON")
    add_engine_args(env)
    add_engines_arg(env)
    env.add_argument("--app", default=None, metavar="URL",
                     help="ask a running app instead (e.g. http://127.0.0.1:7860): its engines' health too")
    return parser


def add_capacity_parser(sub) -> None:
    """``capacity``: the most users (or req/s) each engine serves under a latency target (lab/capacity/)."""
    from lab.capacity import DEFAULT_TIME_LIMIT_S, MIN_REQUESTS, REQUESTS_PER_USER

    cap = sub.add_parser("capacity", help="how many users each engine serves under a latency target (p95 TTFT...)")
    cap.add_argument("--slo", required=True, help="targets, e.g. ttft_p95=2s,tpot_p95=150ms (metrics ttft, tpot, "
                                                  "itl, e2e; percentile _p50 to _p99.9; a bare metric is its p95)")
    add_engines_arg(cap)
    cap.add_argument("--max-users", type=whole_arg, default=MAX_USERS,
                     help=f"the most users probed (open loop: the cap in flight; 1-{MAX_USERS})")
    cap.add_argument("--workload", default="mixed", help=f"one of {', '.join(WORKLOADS)}")
    cap.add_argument("--requests-per-user", type=whole_arg, default=REQUESTS_PER_USER,
                     help=f"requests each user sends in a probe (default {REQUESTS_PER_USER})")
    cap.add_argument("--min-requests", type=whole_arg, default=MIN_REQUESTS,
                     help=f"requests a probe sends at least, whatever its users (default {MIN_REQUESTS})")
    cap.add_argument("--output-len", type=whole_arg, default=None, help="force every output length")
    cap.add_argument("--warmup", type=whole_arg, default=2, help="unmeasured warm-up requests per engine")
    cap.add_argument("--seed", type=whole_arg, default=0)
    cap.add_argument("--think-time", type=number_arg, default=1.0, help="chat workload: seconds between turns")
    cap.add_argument("--rate-search", action="store_true",
                     help="open loop: the largest request rate each engine sustains (latency from the scheduled send)")
    cap.add_argument("--start-rate", type=number_arg, default=1.0, help="--rate-search's first rate (req/s)")
    cap.add_argument("--max-rate", type=number_arg, default=MAX_RATE, help="--rate-search's highest rate (req/s)")
    cap.add_argument("--time-limit", type=number_arg, default=DEFAULT_TIME_LIMIT_S,
                     help=f"seconds for the whole search, engine start-up included (default {DEFAULT_TIME_LIMIT_S:g})")
    cap.add_argument("--out", default="results/capacity", help="folder for capacity.json and requests.csv")
    add_engine_args(cap)


def plan_from(args: argparse.Namespace) -> RunPlan:
    """A validated RunPlan from parsed CLI options (ValueError on bad input)."""
    engines = engines_from(args)
    requests = args.requests_per_user
    if requests is None and args.duration is None:
        requests = 2
    load = LoadConfig(
        users=parse_users(args.users), workload=args.workload, requests_per_user=requests,
        duration_s=args.duration, output_len=args.output_len, exact_lengths=not args.no_exact,
        warmup_requests=args.warmup, seed=args.seed, repeats=args.repeats,
        max_users=args.max_users, max_requests=args.max_requests,
        rate=args.rate, arrival=args.arrival, burstiness=args.burstiness, slo=parse_slo(args.slo),
        think_s=args.think_time,
    )
    return RunPlan(engines=engines, load=load, engine=engine_config_from(args))


class ConsoleProgress:
    """A run's progress on the one channel: a tqdm bar over all planned requests, the current engine and level as
    its label, closed as the run ends."""

    def __init__(self) -> None:
        self.bar = None
        self.done = 0

    def __call__(self, result) -> None:
        if self.bar is None:
            self.bar = self._open(result.plan)
        done = sum(len(level.records) for level in result.levels)
        if done != self.done:
            self.bar.update(done - self.done)
            self.done = done
        self.bar.set_description_str(result.message, refresh=False)
        if result.ended_at:
            self.bar.close()

    @staticmethod
    def _open(plan):
        from tqdm import tqdm

        load, total = plan.load, None
        if load.requests_per_user is not None:
            total = sum(load.users) * load.requests_per_user * len(plan.engines) * load.repeats
        return tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True)


class ProbeLines:
    """A capacity search's progress on the one channel: one line on stderr per finished probe."""

    def __init__(self) -> None:
        self.printed = 0

    def __call__(self, result) -> None:
        from lab.capacity import probe_line

        for name, probe in result.probes[self.printed:]:
            print(probe_line(name, probe, result.plan), file=sys.stderr, flush=True)
        self.printed = len(result.probes)


def said(what: str):
    """An experiment's or a sweep's progress on the one channel: its message, logged."""
    return lambda result: log.info("%s: %s", what, result.message)


def ms(value: float | None) -> str:
    """Seconds as whole milliseconds, '-' when missing."""
    return f"{value * 1000:.0f}ms" if value is not None else "-"


def format_table(result) -> str:
    """The run as a plain-text table: one row per engine and level, then the ratios (and a chat run's turns)."""
    from lab.runs import summary_dict

    load = result.plan.load
    width = max([6] + [len(name) for name in result.plan.engines])
    head = (f"{'engine':<{width}} {'users':>5} {'rep':>3} {'done':>5} {'err':>4} {'out tok/s':>10} {'TTFT p50':>9} "
            f"{'TPOT p50':>9} {'E2E p90':>8} {'KV peak':>8}" + (f" {'queue p50':>9}" if load.rate else "")
            + (f" {'goodput':>9}" if load.slo else ""))
    lines = [head, "-" * len(head)]
    for level in result.levels:
        s = level.summary
        if s is None:
            continue
        kv = level.kv.get("peak_usage")
        kv_text = f"{kv:.1%}" if kv is not None else "-"
        line = (f"{s.engine:<{width}} {s.users:>5} {s.repeat + 1:>3} {s.completed:>5} {s.errors:>4} "
                f"{s.output_tok_s:>10.1f} {ms(s.ttft_s.p50):>9} {ms(s.tpot_s.p50):>9} {ms(s.e2e_s.p90):>8} "
                f"{kv_text:>8}")
        if load.rate:
            line += f" {ms(s.queue_s.p50 if s.queue_s else None):>9}"
        if load.slo:
            line += f" {s.goodput_req_s or 0:>5.2f}r/s"
        lines.append(line)
    rows = [s.to_dict() for s in result.summaries()]
    for top, base in ratio_pairs(result.plan.engines):
        spreads = ratio_spreads(rows, base, top)
        for users, ratio in result.ratio(base, top).items():
            found = spreads.get(users)
            between = f" (repeats: {found.low:.2f}-{found.high:.2f}x, n={found.n})" if found and found.n > 1 else ""
            pair = f"{registry.label(top)}/{registry.label(base)}"
            lines.append(f"{pair} output tok/s at {users} users: {ratio:.2f}x{between}")
    return "\n".join(lines + turn_lines(summary_dict(result)))


def turn_lines(summary: dict) -> list[str]:
    """A chat run's per-turn table (prompt, prefix-cache hits, TTFT per turn number) and its computed sentences."""
    from lab.metrics.turns_words import chat_answer

    rows = summary.get("turns") or []
    if not rows:
        return []
    head = f"{'engine':<12} {'users':>5} {'turn':>4} {'done':>5} {'prompt':>7} {'cached':>7} {'TTFT p50':>9}"
    lines = ["", "per turn (the prompt re-sends the history):", head, "-" * len(head)]
    for row in rows:
        hit = row["prefix_hit_rate"]
        lines.append(f"{row['engine']:<12} {row['users']:>5} {row['turn']:>4} {row['requests']:>5} "
                     f"{row['prompt_tokens_mean']:>7.0f} {f'{hit:.0%}' if hit is not None else '-':>7} "
                     f"{ms(row['ttft_p50_s']):>9}")
    return lines + chat_answer(summary)


def say_failure(what: str, exc: Exception) -> None:
    """An engine that failed to start, or a command that broke: the reason on stderr (exit 1 follows)."""
    log.exception("%s failed", what)
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)


def say_end(result, paths) -> None:
    """How a bench, experiment or sweep ended, and the files it wrote (also after a failure)."""
    print(f"status: {result.status}{' - ' + result.error if result.error else ''}")
    print("wrote " + " and ".join(str(path) for path in paths))


def print_agreement(session) -> None:
    """The agreement verdicts, one line per engine pair (stderr: a warning belongs beside the logs)."""
    if session.agreement is not None:
        for line in session.agreement.verdicts():
            print(line, file=sys.stderr)


@dataclass
class Job:
    """One task for the runner: its request (its kind: lab.tasks), its folder, how it prints and its progress."""

    plan: Any
    out: str
    show: Callable
    progress: Callable
    stem: tuple = ()  # an experiment's file stem: experiment (the default) or explain

    def write(self, result) -> dict:
        """Its files (its kind's writer)."""
        return spec_of(self.plan).write(result, self.out, *self.stem)


class Keeper:
    """The runner's listener on the one progress channel: the console's progress, the files where its kind rewrites
    them as it goes, and the history at each of its checkpoints (lab.store.save_at_checkpoint)."""

    def __init__(self, job: Job):
        self.job, self.stored = job, None

    def __call__(self, result) -> None:
        from lab.store import default_db_path, keep, save_at_checkpoint

        self.job.progress(result)
        if spec_of(self.job.plan).write_live:
            self.job.write(result)
        self.stored = save_at_checkpoint(result, self.stored, lambda ended: keep(default_db_path(), ended))


def session_engines(config: EngineConfig, jobs: list[Job]) -> tuple[str, ...]:
    """The engines the jobs' session loads: each job's kind says which its request needs (TaskSpec.engines), in the
    order the jobs first name them."""
    wanted = (name for job in jobs for name in spec_of(job.plan).engines(job.plan, config))
    return tuple(dict.fromkeys(wanted))


def run_jobs(config: EngineConfig, jobs: list[Job]) -> int:
    """The one runner every task command uses: check every job (ValueError: exit 2, nothing loaded), start the
    session on the engines the jobs need, run each job in turn (stopping after one that did not end ok), write,
    store and print each (also when it fails: what it measured is kept), stop the session. 0 when every job ended
    ok, else 1."""
    from lab.session import check_session, run_async

    for job in jobs:
        spec_of(job.plan).check(job.plan, config, None)
    engines = session_engines(config, jobs)
    check = check_session(config, engines)
    for job in jobs:
        if warning := spec_of(job.plan).warning(job.plan, check.memory):
            print(f"warning: {warning}", file=sys.stderr)
    return run_async(_run_jobs(config, engines, check, jobs))


async def _run_jobs(config: EngineConfig, engines, check, jobs: list[Job]) -> int:
    from lab.session import LabSession, settle_heap

    # several jobs on one session: the rung engines a ladder starts stay loaded for the next (lab.session)
    session, codes = LabSession(config, engines, check, keep_rungs=len(jobs) > 1), []
    try:
        if not all(spec_of(job.plan).starts_session for job in jobs):
            await session.start()
            settle_heap()
            print_agreement(session)
        for job in jobs:
            codes.append(await run_job(session, job))
            if codes[-1]:
                break
    except Exception as exc:  # noqa: BLE001 - an engine that fails to start: say why, exit 1
        say_failure(spec_of(jobs[0].plan).kind, exc)
        codes.append(1)
    finally:
        await session.stop()
    return max(codes)


async def run_job(session, job: Job) -> int:
    """One job on a started session: its result, run with progress (which stores it), then written and printed."""
    task = spec_of(job.plan)
    result = task.new(session, job.plan)
    try:
        await task.run(session, job.plan, result, Keeper(job))
    finally:
        paths = job.write(result)
        job.show(result)
        say_end(result, paths.values())
    return 0 if result.status == RunStatus.OK else 1


async def agree(config: EngineConfig, engines: tuple[str, ...], check, as_json: bool) -> int:
    """Load the engines (the session checks agreement as it starts), print the result, stop them."""
    from lab.session import LabSession

    session = LabSession(config, engines, check)
    try:
        await session.start()
        report = session.agreement
        print(json.dumps({"ok": report.ok, "pairs": report.to_dict()}, indent=2) if as_json
              else "\n".join(report.verdicts()))
        return 1 if report.ok is False else 0
    finally:
        await session.stop()


def run_env(args: argparse.Namespace) -> int:
    """Print the device, versions and memory plan as JSON (with --app: the running app's Environment tab,
    each engine's health included)."""
    from lab.environment import versions
    from lab.session import check_session

    if args.app:
        from gradio_client import Client

        _, env = Client(args.app, verbose=False).predict(api_name="/environment")
        print(json.dumps(env, indent=2))
        return 0
    check = check_session(engine_config_from(args), engines_from(args))
    print(json.dumps({"model": check.model, "model_path": check.model_path,
                      "device": check.memory.device.to_dict(), "memory": check.memory.to_dict(),
                      "versions": versions()}, indent=2))
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Check every rule first (exit 2), then compare the engines' greedy text."""
    from lab.session import check_session, run_async

    config, engines = engine_config_from(args), engines_from(args)
    if len(engines) < 2:
        raise ValueError(f"check compares two engines, got --engines {args.engines!r}: use e.g. hf,vllm")
    check = check_session(config, engines)
    return run_async(agree(config, engines, check, args.json))


def run_bench(args: argparse.Namespace) -> int:
    """Check every rule first (exit 2), warn about a KV pool too small for the plan, then run it."""
    plan = plan_from(args)
    return run_jobs(plan.engine, [Job(plan, args.out, print_table, ConsoleProgress())])


def run_experiment_cli(args: argparse.Namespace) -> int:
    """Validate the experiment's parameters and the session (exit 2), then run it and write its files."""
    from lab.experiments import ExperimentPlan, parse_pairs, parse_params

    plan = ExperimentPlan(args.name, parse_params(args.name, parse_pairs(" ".join(args.param))))
    job = Job(plan, args.out or f"results/{args.name}", print_fields, said(args.name))
    return run_jobs(engine_config_from(args), [job])


def run_explain(args: argparse.Namespace) -> int:
    """Validate preset, repeats and rungs and the session (exit 2), then climb the ladder and write explain.json;
    several presets run on one session that keeps the rung engines loaded between them, into DIR/PRESET/."""
    from lab.experiments import ExperimentPlan
    from lab.experiments.why import Params, preset_config
    from lab.memory import model_kv_bytes_per_token
    from lab.model import resolve_model

    presets = [p.strip() for p in args.preset.split(",") if p.strip()] or [""]
    every = [Params(preset=p, repeats=args.repeats, rungs=args.rungs, users=args.users) for p in presets]
    config = engine_config_from(args)
    if len(every) == 1:  # the session runs the preset's settings: its hf and vllm are then the rungs' own
        per_token = model_kv_bytes_per_token(resolve_model(config.model), config.resolved_dtype())
        config = preset_config(every[0], config, per_token)
    jobs = [Job(ExperimentPlan("why", params), args.out if len(every) == 1 else f"{args.out}/{params.preset}",
                print_ladder, said("why"), ("explain",)) for params in every]
    return run_jobs(config, jobs)  # the ladder's kind says which engines the session loads (why.engines)


def print_ladder(result) -> None:
    """Each level's ladder as a plain table (tok/s per repeat, each step's factor), then the computed explanation."""
    fields = result.fields
    for users, level in (fields.get("levels") or {str(fields.get("load", {}).get("users")): fields}).items():
        print(f"-- {users} user(s) --")
        print_level(level)
    print(fields.get("caption", ""))


def print_level(fields: dict) -> None:
    """One level of a ladder: its rungs, its steps and its total."""
    print(f"{'rung':<12} {'status':<8} {'out tok/s per repeat':<30} {'ms/token p50':>12}")
    for name, rung in fields.get("rungs", {}).items():
        rates = " ".join(f"{v:.1f}" for v in rung["tok_s"]) or rung["reason"]
        step = rung.get("tpot_ms_median")
        print(f"{name:<12} {rung['status']:<8} {rates:<30} {step if step is not None else '-':>12}  "
              f"{rung.get('flags', '')}")
    for f in fields.get("factors", []) + fields.get("sides", []):
        where = "" if f["in_product"] else "  (side: outside the product)"
        print(f"{f['lower']} -> {f['upper']}: {f['value']:.2f}x [{f['low']:.2f}-{f['high']:.2f}, n={f['n']}] "
              f"{f['mechanism']}{where}")
    if fields.get("total"):
        print(f"vllm / hf: {fields['total']['value']:.2f}x; product of the steps: {fields['product']:.2f}x")


def print_fields(result) -> None:
    """An experiment's fields as JSON (less its figure's series and the run's stamps)."""
    print(json.dumps({k: v for k, v in result.to_dict().items() if k not in ("series", "versions",
                                                                               "engine_args", "device")},
                     indent=2, default=str))


def run_sweep_cli(args: argparse.Namespace) -> int:
    """Validate the knob, every value and the load (exit 2), then sweep on the knob's engine alone."""
    from lab.sweeps import sweep_plan

    plan = sweep_plan(args.knob, args.values, args.users, args.workload, args.requests_per_user, args.output_len)
    job = Job(plan, args.out or f"results/sweep-{args.knob}", print_points, said("sweep"))
    return run_jobs(engine_config_from(args), [job])


def run_capacity_cli(args: argparse.Namespace) -> int:
    """Check the targets, bounds, load and session (exit 2), then search each engine's capacity and write
    DIR/capacity.json (after every probe) and DIR/requests.csv, and store the result (also when it fails)."""
    from lab.capacity import capacity_plan

    config = engine_config_from(args)
    plan = capacity_plan(args.slo, engines_from(args), config, workload=args.workload, max_users=args.max_users,
                         requests_per_user=args.requests_per_user, min_requests=args.min_requests,
                         output_len=args.output_len, warmup=args.warmup, seed=args.seed, think_s=args.think_time,
                         rate_search=args.rate_search, start_rate=args.start_rate, max_rate=args.max_rate,
                         time_limit_s=args.time_limit)
    return run_jobs(config, [Job(plan, args.out, print_capacity, ProbeLines())])


def print_table(result) -> None:
    """A run's table (format_table)."""
    print(format_table(result))


def print_points(result) -> None:
    """A sweep's points as JSON."""
    print(json.dumps(result.points, indent=2, default=str))


def print_capacity(result) -> None:
    """A capacity search's table and sentences."""
    from lab.capacity import format_capacity

    print(format_capacity(result.to_dict()))


def run_serve(args: argparse.Namespace) -> int:
    """Start a server on the model, print where it answers, keep it up until Ctrl-C or SIGTERM."""
    import shlex
    import signal

    from lab.model import resolve_model
    from lab.serve import start_server, stop

    config = engine_config_from(args)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 (any free one) to 65535, not {args.port}")
    if args.engine == "vllm":
        config.check_block_size()
    key = args.api_key or (os.environ.get(API_KEY_ENV) if args.engine == "vllm" else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # before the start: a stop while it loads cleans up too
    server = start_server(args.engine, config, resolve_model(config.model), args.port, api_key=key)
    model = f" --model {shlex.quote(config.model)}" if config.model else ""
    print(f"serving {args.engine} at {server.url} (model {server.model}); load-test it with:\n"
          f"  python -m lab bench --engines openai --base-url {server.url} --served-model-name "
          f"{shlex.quote(server.model)}{model}", flush=True)
    try:
        return server.process.wait()
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        stop(server)


def run_report(args: argparse.Namespace) -> int:
    """Write the HTML report of a run, experiment, sweep or capacity search, or list the stored ids; an unknown id
    or folder is bad input (exit 2)."""
    from lab.report import stored_lines, write_report

    if args.list:
        print("\n".join(stored_lines()) or "nothing stored yet")
        return 0
    if not args.run:
        raise ValueError("give a folder or a stored result's id (python -m lab report --list lists the ids)")
    try:
        path = write_report(args.run, args.out)
    except KeyError as exc:
        raise ValueError(f"{exc.args[0]} (give a folder holding summary.json, experiment.json, explain.json or "
                         f"sweep.json, or an id that python -m lab report --list prints)") from None
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failed, cancelled or disagreeing, 2 bad input)."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if args.command == "setup-model":
        from lab.model import build_embedded_model

        print(build_embedded_model())
        return 0
    commands = {"env": run_env, "check": run_check, "bench": run_bench, "experiment": run_experiment_cli,
                "explain": run_explain, "sweep": run_sweep_cli, "capacity": run_capacity_cli, "serve": run_serve,
                "report": run_report}
    try:
        return commands[args.command](args)
    except ValueError as exc:  # a rule broken before anything loaded
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
