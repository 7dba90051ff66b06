"""Does the load client itself add latency? 1,000 concurrent streams from one core, per HTTP client.

Starts the fake OpenAI server (bench/fake_openai_server.py) in a subprocess pinned to one core, then
runs each candidate client in its own subprocess pinned to the other core. A client keeps ``--streams``
streams going: every slot sends ``--rounds`` requests one after the other (``--tokens`` tokens each,
``--gap-ms`` apart, lengths spread by ``--spread``), so round 1 opens all streams at once (the burst)
and later rounds start each new request as another ends, while the other streams run (``vllm bench
serve`` gets the same with ``--num-prompts streams x rounds --max-concurrency streams``). A client stamps
each token when its code has it parsed; the server stamps each chunk right before its write, with the
same clock (time.perf_counter() is CLOCK_MONOTONIC, one clock for every process on Linux), so:

    TTFT+       = client receive time of the first token - server send time of the first token
    TTFT-srv    = client TTFT (receive - client send start) - server TTFT (first send - arrival): the
                  definition that needs no shared clock; it also counts the client's wait to send the
                  request, so it is how much a tool's own reported TTFT exceeds the server's
    tok+        = client receive time - server send time, over every token of every stream
    open all    = last arrival at the server of round 1 - the client's first request start
    conns       = TCP connections the server accepted (keep-alive reuse: ~streams)
    cpu us/tok  = the client's CPU time over its streams, per token received (requests' cost included)
    srv late    = how late the server sent its tokens against their schedule (its own health)
    other cpu   = CPU that processes other than the server and this client used meanwhile, and steal =
                  time the hypervisor took from this VM (shares of all cores); either above a few
                  percent disturbs the figures
    gc max/all  = the client's longest garbage-collector pause while its streams ran, and all of them

--repeats N runs the candidates in turn N times and adds a table of medians over the quiet repeats (other
CPU and steal under 5%). --server-steps makes the server send like an engine: every gap, one pass sends the next token
of every running stream, so the client gets up to --streams chunks at once (vLLM's decode step), not chunks
spread by per-stream timers.

Candidates: aiohttp and httpx written the plain way (a readline and a json.loads per SSE line), each on
asyncio's default loop and on uvloop; aiohttp tuned (bodies encoded up front, whole
reads split on blank lines, orjson, gc.freeze() after set-up); the lab's own OpenAIEngine
(lab/engines/openai.py: as is, and with gc.freeze() after its start as the CLI and app do, ``lab.frozen``;
``lab.parsed`` is lab.frozen with its tokens stamped when parsed, not when their bytes arrived); ``vllm bench
serve`` (vLLM's benchmark module, run from Python, random dataset, tqdm on as its users see it). Every
candidate is named CLIENT-LOOP; ``--candidates`` lists them all (the default leaves out httpx-asyncio,
~65 s, for time). A candidate that fails shows its error in its row; the others still run. No figure is asserted: the VM
this was written on stalls a busy vCPU for up to ~10 ms at times, so read p50s, and p99s with care.

Usage: python -m bench.client_overhead [--streams 1000] [--rounds 2] [--tokens 16] [--gap-ms 100]
       [--candidates aiohttp-uvloop,vllm-bench] [--repeats 1] [--server-steps] [--json] [--keep DIR]
       [--server-impl raw|aiohttp]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.fake_openai_server import fetch_stamps, free_port, serve_in_subprocess

log = logging.getLogger("client_overhead")
MODEL = "fake"
PROMPT_LEN = 32
CANDIDATES = ("aiohttp-asyncio", "aiohttp-uvloop", "aiohttp.tuned-asyncio", "aiohttp.tuned-uvloop", "httpx-asyncio",
              "httpx-uvloop", "lab-asyncio", "lab-uvloop", "lab.frozen-asyncio", "lab.frozen-uvloop",
              "lab.parsed-uvloop", "vllm-bench")
# httpx-asyncio is left out by default only for time: ~65 s at the defaults (httpx spends ~2 ms of CPU per token at
# 1,000 connections), and it lost to httpx-uvloop on every measure
DEFAULT_CANDIDATES = ("aiohttp-asyncio", "aiohttp-uvloop", "aiohttp.tuned-uvloop", "httpx-uvloop", "lab-asyncio",
                      "lab-uvloop", "lab.frozen-uvloop", "vllm-bench")
WORKER_TIMEOUT_S = 240
QUIET_SHARE = 0.05  # a repeat is quiet when other processes, and the hypervisor, took less than this share meanwhile


# ---- the client side (runs in the worker subprocess) ------------------------------------------

def request_tokens(index: int, tokens: int, spread: float) -> int:
    """Output tokens of request ``index``: uniform in tokens x [1 - spread, 1 + spread] (seeded by the index),
    so that requests end, and the next ones start, at scattered times."""
    return max(1, round(tokens * (1 + spread * random.Random(index).uniform(-1, 1))))


def lab_payload(tokens: int) -> dict:
    """The request body the lab's engine sends: token-id prompt, exact length, token ids back."""
    return {"model": MODEL, "prompt": list(range(100, 100 + PROMPT_LEN)), "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}


def event_token_ids(data: bytes, loads=json.loads) -> list[int] | None:
    """Token ids of one SSE event's data (after ``data: ``); None for [DONE] and usage-only events."""
    if data.startswith(b"[DONE]"):
        return None
    choices = loads(data)["choices"]
    return (choices[0].get("token_ids") or []) if choices else None


async def aiohttp_streams(url: str, ids: list[list[str]], tokens: dict[str, int]) -> dict:
    """aiohttp read the lab's way: one session without a connection cap, one json.loads per line."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(request_id: str) -> dict:
            start = time.perf_counter()
            recv: list[float] = []
            async with session.post(f"{url}/v1/completions", json=lab_payload(tokens[request_id]),
                                    headers={"X-Request-Id": request_id}) as response:
                response.raise_for_status()
                async for line in response.content:  # readline
                    if line.startswith(b"data: "):
                        got = event_token_ids(line[6:])
                        if got:
                            now = time.perf_counter()
                            recv.extend([now] * len(got))
            return {"start_s": start, "recv_s": recv}

        return await run_slots(one, ids)


async def aiohttp_tuned_streams(url: str, ids: list[list[str]], tokens: dict[str, int]) -> dict:
    """aiohttp tuned: bodies encoded up front, whole reads (iter_any) split on blank lines, orjson, one stamp
    per read, the start-up heap frozen out of the garbage collector's way (run_slots(freeze=True))."""
    import aiohttp
    import orjson

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    bodies = {request_id: orjson.dumps(lab_payload(n)) for request_id, n in tokens.items()}  # encoded up front
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(request_id: str) -> dict:
            start = time.perf_counter()
            recv: list[float] = []
            headers = {"X-Request-Id": request_id, "Content-Type": "application/json"}
            async with session.post(f"{url}/v1/completions", data=bodies[request_id], headers=headers) as response:
                response.raise_for_status()
                pending = b""
                async for data in response.content.iter_any():
                    now = time.perf_counter()
                    *events, pending = (pending + data).split(b"\n\n")
                    for event in events:
                        if event.startswith(b"data: "):
                            got = event_token_ids(event[6:], orjson.loads)
                            if got:
                                recv.extend([now] * len(got))
            return {"start_s": start, "recv_s": recv}

        return await run_slots(one, ids, freeze=True)


async def httpx_streams(url: str, ids: list[list[str]], tokens: dict[str, int]) -> dict:
    """httpx read the lab's way: one client without connection caps, aiter_lines, one json.loads per line."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=60)) as client:

        async def one(request_id: str) -> dict:
            start = time.perf_counter()
            recv: list[float] = []
            async with client.stream("POST", f"{url}/v1/completions", json=lab_payload(tokens[request_id]),
                                     headers={"X-Request-Id": request_id}) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        got = event_token_ids(line[6:].encode())
                        if got:
                            now = time.perf_counter()
                            recv.extend([now] * len(got))
            return {"start_s": start, "recv_s": recv}

        return await run_slots(one, ids)


def make_lab_engine(url: str, tokenizer: str):
    """The lab's OpenAIEngine on the fake server (the tokenizer only builds the engine's probe)."""
    from lab.config import Endpoint, EngineConfig
    from lab.engines.openai import OpenAIEngine

    return OpenAIEngine(Endpoint(base_url=url, model=MODEL), EngineConfig(model=tokenizer), tokenizer)


async def lab_streams(url: str, ids: list[list[str]], tokens: dict[str, int], tokenizer: str,
                      freeze: bool = False, on_arrival: bool = True) -> dict:
    """The lab's OpenAIEngine; a TokenChunk's time_s is its receive time. freeze: gc.freeze() after its start
    (the transformers tokenizer it loads leaves ~370,000 objects that every full collection would walk).
    on_arrival=False: stamp tokens when parsed (the engine before it noted arrivals)."""
    from lab.engines import openai
    from lab.engines.base import GenRequest

    if not on_arrival:
        openai.note_arrivals = lambda connector: False
    engine = make_lab_engine(url, tokenizer)
    await engine.start()
    prompt = tuple(range(100, 100 + PROMPT_LEN))
    try:

        async def one(request_id: str) -> dict:
            start = time.perf_counter()
            recv: list[float] = []
            async for chunk in engine.stream(GenRequest(request_id, prompt, tokens[request_id])):
                recv.extend(chunk.token_times())
            return {"start_s": start, "recv_s": recv}

        return await run_slots(one, ids, freeze=freeze)
    finally:
        await engine.stop()


async def run_slots(one, ids: list[list[str]], freeze: bool = False) -> dict:
    """Every slot at once, each running its ids one after the other; per-request results and errors.

    freeze: move every object alive now out of the garbage collector's reach (gc.freeze(), as vLLM's server
    does after start-up), so a full collection during the streams walks only what they create.
    """
    requests, errors = {}, []

    async def slot(own: list[str]) -> None:
        for request_id in own:
            try:
                requests[request_id] = await one(request_id)
            except Exception as error:  # noqa: BLE001 - a failed request is counted, the run goes on
                errors.append(f"{type(error).__name__}: {error}")

    gc.collect()
    if freeze:
        gc.freeze()
    pauses = GcPauses()
    cpu0_s = time.process_time()
    with pauses:
        await asyncio.gather(*(slot(own) for own in ids))
    return {"requests": requests, "errors": errors, "cpu_s": time.process_time() - cpu0_s, "gc_pauses_s": pauses.by_gen}


class GcPauses:
    """The garbage collector's pauses while the streams run, per generation (gc.callbacks)."""

    def __init__(self):
        self.by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._began_s = 0.0

    def __enter__(self):
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began_s = time.perf_counter()
        else:
            self.by_gen[info["generation"]].append(time.perf_counter() - self._began_s)


def vllm_bench(url: str, prefix: str, streams: int, rounds: int, tokens: int, spread: float, tokenizer: str,
               result_dir: str) -> dict:
    """``vllm bench serve`` (its module, from Python) against the server; receive times from its ttfts/itls."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", MODEL,
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(PROMPT_LEN),
        "--random-output-len", str(tokens), "--random-range-ratio", str(spread),
        "--num-prompts", str(streams * rounds),
        "--max-concurrency", str(streams), "--request-rate", "inf", "--ignore-eos",
        "--request-id-prefix", prefix, "--save-result", "--save-detailed", "--result-dir", result_dir,
        "--temperature", "0"])
    result = bench_main(args)
    requests, errors = {}, [e for e in result.get("errors", []) if e]
    for i, (start, ttft, itls) in enumerate(zip(result["start_times"], result["ttfts"], result["itls"],
                                                strict=True)):
        if ttft <= 0:
            continue
        recv = [start + ttft]
        for gap in itls:
            recv.append(recv[-1] + gap)
        requests[f"{prefix}{i}"] = {"start_s": start, "recv_s": recv}
    return {"requests": requests, "errors": errors, "cpu_s": None}


def run_worker(args: argparse.Namespace) -> None:
    """One candidate in this process: pin to the client core, run, write the results to --out."""
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    client, _, loop = args.worker.partition("-")
    prefix = f"{args.worker}-{os.getpid()}-"
    if client == "vllm":
        result = vllm_bench(args.url, prefix, args.streams, args.rounds, args.tokens, args.spread,
                            args.tokenizer, args.result_dir)
    else:
        ids = [[f"{prefix}{r * args.streams + s}" for r in range(args.rounds)] for s in range(args.streams)]
        tokens = {f"{prefix}{i}": request_tokens(i, args.tokens, args.spread)
                  for i in range(args.streams * args.rounds)}
        if client.startswith("lab"):
            coro = lab_streams(args.url, ids, tokens, args.tokenizer, freeze=client != "lab",
                               on_arrival=client != "lab.parsed")
        else:
            streams = {"aiohttp": aiohttp_streams, "aiohttp.tuned": aiohttp_tuned_streams,
                       "httpx": httpx_streams}[client]
            coro = streams(args.url, ids, tokens)
        if loop == "uvloop":
            import uvloop
            result = uvloop.run(coro)
        else:
            result = asyncio.run(coro)
    result["prefix"] = prefix
    Path(args.out).write_text(json.dumps(result))


# ---- the orchestrator -------------------------------------------------------------------------

@dataclass
class Row:
    """One candidate's figures (ms unless named otherwise)."""

    candidate: str
    completed: int = 0
    requests: int = 0
    burst_ttft_added_p50_ms: float | None = None
    burst_ttft_added_p99_ms: float | None = None
    burst_ttft_minus_server_p50_ms: float | None = None
    ttft_added_p50_ms: float | None = None  # steady state: rounds after the first
    ttft_added_p90_ms: float | None = None
    ttft_added_p99_ms: float | None = None
    ttft_minus_server_p50_ms: float | None = None
    token_added_p50_ms: float | None = None
    token_added_p99_ms: float | None = None
    open_all_s: float | None = None
    connections: int | None = None  # TCP connections the server accepted for these requests
    client_cpu_us_per_token: float | None = None
    server_late_p99_ms: float | None = None
    server_cpu_us_per_token: float | None = None
    other_cpu_share: float | None = None
    steal_share: float | None = None
    gc_max_ms: float | None = None  # the client's longest garbage-collector pause while its streams ran
    gc_total_ms: float | None = None
    wall_s: float | None = None
    errors: list[str] = field(default_factory=list)


def ms_percentiles(values: list[float], qs: tuple[float, ...]) -> list[float | None]:
    ordered = sorted(values)
    if not ordered:
        return [None] * len(qs)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 for q in qs]


def figures(name: str, client: dict, stamps: dict, streams: int, rounds: int) -> Row:
    """Join the client's receive times with the server's send times by request id."""
    server, prefix = stamps["requests"], client["prefix"]
    row = Row(name, requests=streams * rounds, errors=summarize_errors(client.get("errors", [])))
    burst, steady, burst_rel, steady_rel, per_token, starts, burst_arrivals = [], [], [], [], [], [], []
    for request_id, seen in client["requests"].items():
        sent = server.get(request_id)
        if sent is None or not seen["recv_s"] or not sent["sent_s"]:
            continue
        recv, send = seen["recv_s"], sent["sent_s"]
        row.completed += len(recv) == sent["tokens"]
        first_round = int(request_id[len(prefix):]) < streams
        (burst if first_round else steady).append(recv[0] - send[0])
        (burst_rel if first_round else steady_rel).append((recv[0] - seen["start_s"]) - (send[0] - sent["arrival_s"]))
        if first_round:
            starts.append(seen["start_s"])
            burst_arrivals.append(sent["arrival_s"])
        per_token.extend(r - s for r, s in zip(recv, send, strict=False))
    row.burst_ttft_added_p50_ms, row.burst_ttft_added_p99_ms = ms_percentiles(burst, (0.5, 0.99))
    row.burst_ttft_minus_server_p50_ms = ms_percentiles(burst_rel, (0.5,))[0]
    row.ttft_added_p50_ms, row.ttft_added_p90_ms, row.ttft_added_p99_ms = ms_percentiles(steady, (0.5, 0.9, 0.99))
    row.ttft_minus_server_p50_ms = ms_percentiles(steady_rel, (0.5,))[0]
    row.token_added_p50_ms, row.token_added_p99_ms = ms_percentiles(per_token, (0.5, 0.99))
    if starts:
        row.open_all_s = max(burst_arrivals) - min(starts)
    row.server_late_p99_ms = stamps.get("late_ms", {}).get("p99")
    if (pauses := client.get("gc_pauses_s")) is not None:
        every = [p for gen in pauses.values() for p in gen]
        row.gc_max_ms, row.gc_total_ms = max(every, default=0.0) * 1e3, sum(every) * 1e3
    row.connections = stamps.get("connections")
    if per_token:
        if client.get("cpu_s") is not None:
            row.client_cpu_us_per_token = client["cpu_s"] / len(per_token) * 1e6
        row.server_cpu_us_per_token = stamps.get("cpu_s", 0.0) / len(per_token) * 1e6
    return row


def summarize_errors(errors: list[str]) -> list[str]:
    """Distinct error texts (last line each) with their counts."""
    counts: dict[str, int] = {}
    for error in errors:
        lines = [ln for ln in str(error).strip().splitlines() if ln.strip()]
        key = lines[-1][:160] if lines else "?"
        counts[key] = counts.get(key, 0) + 1
    return [f"{n} x {text}" for text, n in counts.items()]


def busy_and_steal_s() -> tuple[float, float]:
    """CPU seconds all cores spent busy (user, nice, system, irq, softirq) and stolen by the hypervisor
    since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick, fields[7] / tick


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_candidate(name: str, url: str, args: argparse.Namespace, workdir: Path, tag: str = "") -> Row:
    """Run one candidate's worker subprocess and turn its output and the server's stamps into a Row."""
    fetch_stamps(url, reset=True)
    out = workdir / f"{name}{tag}.json"
    cmd = [sys.executable, "-m", "bench.client_overhead", "--worker", name, "--url", url,
           "--streams", str(args.streams), "--rounds", str(args.rounds), "--tokens", str(args.tokens),
           "--spread", str(args.spread),
           "--out", str(out), "--tokenizer", args.tokenizer, "--result-dir", str(workdir),
           "--client-cpu", str(args.client_cpu)]
    log.info("running %s: %d streams x %d rounds x %d tokens", name, args.streams, args.rounds, args.tokens)
    began, (busy0, steal0), kids0 = time.perf_counter(), busy_and_steal_s(), children_cpu_s()
    with open(workdir / f"{name}{tag}.log", "w") as sink:
        try:
            proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Row(name, requests=args.streams * args.rounds, errors=[f"timed out after {WORKER_TIMEOUT_S} s"])
    wall_s, client_s = time.perf_counter() - began, children_cpu_s() - kids0
    busy1, steal1 = busy_and_steal_s()
    if proc.returncode != 0 or not out.exists():
        tail = (workdir / f"{name}{tag}.log").read_text().strip().splitlines()[-1:] or ["no output"]
        return Row(name, requests=args.streams * args.rounds, errors=[f"exit {proc.returncode}: {tail[0][:200]}"])
    stamps = fetch_stamps(url)
    if args.keep:
        (workdir / f"{name}{tag}.stamps.json").write_text(json.dumps(stamps))
    row = figures(name, json.loads(out.read_text()), stamps, args.streams, args.rounds)
    row.wall_s = wall_s
    cores_s = wall_s * os.cpu_count()
    row.other_cpu_share = max(0.0, busy1 - busy0 - client_s - stamps.get("cpu_s", 0.0)) / cores_s
    row.steal_share = (steal1 - steal0) / cores_s
    return row


def default_tokenizer() -> str:
    """The embedded model's folder (the lab's engine and vLLM's random dataset need one); nothing is downloaded."""
    try:
        from lab.model import embedded_model_dir
        return str(embedded_model_dir())
    except ImportError:
        return str(Path.home() / ".cache" / "kvlab" / "models" / "SmolLM2-135M-Instruct-bf16")


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = (  # group, header, Row field (None: done/requests), width, format
    ("", "client", "candidate", 20, ""), ("", "done", None, 9, ""),
    ("burst", "TTFT+ p50", "burst_ttft_added_p50_ms", 9, ".2f"), ("burst", "p99", "burst_ttft_added_p99_ms", 6, ".1f"),
    ("burst", "TTFT-srv p50", "burst_ttft_minus_server_p50_ms", 12, ".1f"),
    ("then", "TTFT+ p50", "ttft_added_p50_ms", 9, ".2f"), ("then", "p90", "ttft_added_p90_ms", 6, ".2f"),
    ("then", "p99", "ttft_added_p99_ms", 6, ".1f"), ("then", "TTFT-srv p50", "ttft_minus_server_p50_ms", 12, ".1f"),
    ("all", "tok+ p50", "token_added_p50_ms", 8, ".2f"), ("all", "p99", "token_added_p99_ms", 6, ".1f"),
    ("", "open all s", "open_all_s", 10, ".2f"), ("", "conns", "connections", 5, "d"),
    ("", "cpu us/tok", "client_cpu_us_per_token", 10, ".1f"),
    ("", "gc max", "gc_max_ms", 6, ".1f"), ("", "gc all", "gc_total_ms", 6, ".0f"),
    ("", "srv late p99", "server_late_p99_ms", 12, ".1f"), ("", "other cpu", "other_cpu_share", 9, ".0%"),
    ("", "steal", "steal_share", 5, ".0%"),
)
GROUPS = {"burst": "-- burst (round 1) --", "then": "-- later rounds --", "all": "- all tokens -"}


def cell(text: str, width: int, first: bool) -> str:
    return f"{text:<{width}}" if first else f"{text:>{width}}"


def group_line() -> str:
    """Labels centred over the column groups."""
    parts, i = [], 0
    while i < len(COLUMNS):
        group, j = COLUMNS[i][0], i
        while j < len(COLUMNS) and COLUMNS[j][0] == group:
            j += 1
        width = sum(c[3] for c in COLUMNS[i:j]) + (j - i - 1)
        parts.append(f"{GROUPS.get(group, ''):^{width}}")
        i = j
    return " ".join(parts).rstrip()


def table(rows: list[Row], args: argparse.Namespace) -> str:
    head = " ".join(cell(h, w, i == 0) for i, (_, h, _, w, _) in enumerate(COLUMNS))
    lines = [f"{args.streams} streams x {args.rounds} rounds x {args.tokens} tokens (+-{args.spread:.0%}), "
             f"{args.gap_ms:g} ms apart (first after {args.first_ms:g} ms{', in shared steps' * args.server_steps}); "
             f"server ({args.server_impl}) on core "
             f"{args.server_cpu}, each client on core {args.client_cpu}; times in ms",
             group_line(), head, "-" * len(head)]
    for r in rows:
        cells = []
        for i, (_, _, name, width, spec) in enumerate(COLUMNS):
            text = f"{r.completed}/{r.requests}" if name is None else (
                r.candidate if i == 0 else fmt(getattr(r, name), spec))
            cells.append(cell(text, width, i == 0))
        lines.append(" ".join(cells))
        lines += [f"    error: {e}" for e in r.errors[:3]]
    lines.append("TTFT+ = receive - send of the first token (one clock); TTFT-srv = client TTFT - server TTFT; "
                 "tok+ = receive - send of every token")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="concurrent streams per client")
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream slot, one after the other")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per request (mean)")
    parser.add_argument("--spread", type=float, default=0.5, help="request lengths uniform in tokens x "
                        "[1 - spread, 1 + spread] (vLLM's --random-range-ratio)")
    parser.add_argument("--gap-ms", type=float, default=100.0, help="the server's time between two tokens")
    parser.add_argument("--first-ms", type=float, default=None, help="the server's time to the first token "
                        "(default: the gap)")
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES),
                        help="comma-separated, of " + ", ".join(CANDIDATES) + " (default: all but the "
                        "asyncio variants of httpx and of the tuned and frozen clients)")
    parser.add_argument("--port", type=int, default=None, help="the fake server's port (default: a free one)")
    parser.add_argument("--server-impl", choices=("raw", "aiohttp"), default="raw")
    parser.add_argument("--server-steps", action="store_true", help="engine-like timing: every gap, every "
                        "running stream's next token leaves in one pass (a burst of --streams chunks)")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder for the lab's engine and vllm-bench "
                        "(default: the embedded model's folder)")
    parser.add_argument("--repeats", type=int, default=1, help="run every candidate this many times, in turn "
                        "(a, b, a, b, ...), and add a table of the medians over the repeats")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    parser.add_argument("--keep", default=None, help="keep the clients' raw results and logs in this folder")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.first_ms = args.gap_ms if args.first_ms is None else args.first_ms
    return args


def run_all(args: argparse.Namespace) -> list[Row]:
    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    os.sched_setaffinity(0, {args.client_cpu})  # this process only waits; keep it off the server's core
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with serve_in_subprocess(args.port or free_port(), gap_ms=args.gap_ms, first_ms=args.first_ms,
                                 cpu=args.server_cpu, model=MODEL, impl=args.server_impl,
                                 steps=args.server_steps) as url:
            for turn, name in enumerate(names * args.repeats):
                tag = f".{turn // len(names)}" if args.repeats > 1 else ""  # --keep keeps every repeat's files
                try:
                    rows.append(run_candidate(name, url, args, workdir, tag))
                except Exception as error:  # noqa: BLE001 - one candidate's failure is its row, not the run's
                    rows.append(Row(name, requests=args.streams * args.rounds,
                                    errors=[f"{type(error).__name__}: {error}"]))
                row = rows[-1]
                log.info("%s: %d/%d done, TTFT+ p50 %s ms (burst) %s ms (later), %s", name, row.completed,
                         row.requests, fmt(row.burst_ttft_added_p50_ms), fmt(row.ttft_added_p50_ms),
                         "; ".join(row.errors) or "no errors")
    return rows


def medians(rows: list[Row]) -> list[Row]:
    """One row per candidate: each figure's median over its quiet repeats (other processes and the hypervisor's
    steal each under 5% of the CPU meanwhile; all repeats where none was quiet), errors of every repeat."""
    by_name: dict[str, list[Row]] = {}
    for row in rows:
        by_name.setdefault(row.candidate, []).append(row)
    return [median_row(name, repeats) for name, repeats in by_name.items()]


def median_row(name: str, repeats: list[Row]) -> Row:
    quiet = [r for r in repeats if r.other_cpu_share is not None and r.other_cpu_share < QUIET_SHARE
             and (r.steal_share or 0.0) < QUIET_SHARE]
    merged = Row(f"{name} {len(quiet)}/{len(repeats)}q" if quiet else f"{name} x{len(repeats)}",
                 errors=[e for r in repeats for e in r.errors])
    repeats = quiet or repeats
    merged.completed, merged.requests = sum(r.completed for r in repeats), sum(r.requests for r in repeats)
    for key in asdict(merged):
        found = [getattr(r, key) for r in repeats if isinstance(getattr(r, key), (int, float))]
        if key not in ("candidate", "completed", "requests", "errors") and found:
            setattr(merged, key, type(found[0])(statistics.median(found)))
    return merged


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.tokenizer = args.tokenizer or default_tokenizer()
    rows = run_all(args)
    if args.json:
        keys = ("streams", "rounds", "repeats", "tokens", "spread", "gap_ms", "first_ms", "server_impl", "server_steps",
                "server_cpu", "client_cpu")
        print(json.dumps({"settings": {k: getattr(args, k) for k in keys}, "rows": [asdict(r) for r in rows],
                          "medians": [asdict(r) for r in medians(rows)]}, indent=1))
    else:
        print(table(rows, args))
        if args.repeats > 1:
            print(f"\nMedians over the quiet repeats of {args.repeats} (candidates run in turn; 'k/nq': k of n repeats "
                  f"had other processes and steal under {QUIET_SHARE:.0%} of the CPU; 'xn': none did, all n counted):")
            print(table(medians(rows), args))


if __name__ == "__main__":
    main()
