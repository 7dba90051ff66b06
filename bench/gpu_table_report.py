"""The contenders' table on one GPU, run level by level and put into markdown.

``run`` loads the chosen engines once in one process (a LabSession, as ``python -m lab bench`` does) and runs
one plan per (workload, user level) on them, writing each plan's summary.json / requests.csv with the lab's
own ``write_run`` into ROOT/TAG/WORKLOAD-uUSERS/. A plan already written with status ok is skipped, so a
second call on the same machine finishes what a first one left (each call has a time limit). Every plan
is exactly what ``python -m lab bench --users U --workload W --requests-per-user R ...`` sends at that level
(the requests of a level depend only on the seed and the user count). Beside them, memory-N.json: the
CUDA memory this process holds after each engine's start (torch, main process: HF and HF-CB live here)
and its peak during each engine's level, the vLLM engine-core processes this process started (by start
order: the first is ``vllm``, the second ``vllm-engine``) and NVML's per-process memory at each step.

``table`` reads those folders (and the nvidia-smi samples scripts/gpu_table.sh takes once a second)
and prints the markdown tables of docs/results/h100-table/README.md.

    python -m bench.gpu_table_report run --tag 135m --model .gpu-pack/model --engines hf,hf-cb,vllm,vllm-engine \
        --kv-cache-gib 8 --plans mixed:1,5,10,20:2 mixed:64:1 decode:1,5,10,20,64:1 --root /tmp/gpu_table
    python -m bench.gpu_table_report table /tmp/gpu_table
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import logging
import os
import sys
import time
from pathlib import Path

ENGINE_ORDER = ("hf", "hf-cb", "vllm", "vllm-engine")
LABEL = {"hf": "HF static", "hf-cb": "HF-CB", "vllm": "vLLM served", "vllm-engine": "vLLM engine"}
MIB = 1024**2
GIB = 1024**3


# -- run ----------------------------------------------------------------------------------------

def parse_plans(specs: list[str]) -> list[tuple[str, int, int]]:
    """'mixed:1,5,10,20:2' -> (mixed, 1, 2), (mixed, 5, 2), ...: one unit per workload and user level."""
    units = []
    for spec in specs:
        workload, users, rpu = spec.split(":")
        units += [(workload, int(u), int(rpu)) for u in users.split(",")]
    return units


def unit_dir(root: Path, tag: str, workload: str, users: int) -> Path:
    return root / tag / f"{workload}-u{users}"


def done(folder: Path) -> bool:
    summary = folder / "summary.json"
    return summary.is_file() and json.loads(summary.read_text()).get("status") == "ok"


def torch_memory() -> dict | None:
    """This process's CUDA allocator figures (None before CUDA is initialized here: never initialize it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return {"allocated_mib": torch.cuda.memory_allocated() / MIB, "reserved_mib": torch.cuda.memory_reserved() / MIB,
            "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB}


def children() -> dict[int, str]:
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            found[child.pid] = child.name()
        except psutil.Error:
            pass
    return found


def nvml_processes() -> list[dict]:
    from lab.environment import read_gpu

    gpu = read_gpu()
    return gpu.extra.get("processes", []) if gpu and hasattr(gpu, "extra") else []


class Recorder:
    """Memory at each start step, the vLLM processes each engine start added, and per-level peaks."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.known: set[int] = set()
        self.pending_engine: str | None = None
        self.engine_pids: dict[str, list[dict]] = {}
        self.levels: list[dict] = []
        self.current = None

    def step(self, text: str) -> None:
        """Called before each start step (and once after the last): attribute new child processes."""
        now = children()
        new = {pid: name for pid, name in now.items() if pid not in self.known}
        self.known |= set(now)
        if self.pending_engine is not None and new:
            self.engine_pids[self.pending_engine] = [{"pid": p, "name": n} for p, n in new.items()]
        self.events.append({"time": time.time(), "text": text, "torch": torch_memory(),
                            "nvml": safe(nvml_processes), "children": now})
        self.pending_engine = text.split(": ", 1)[1].split(" ", 1)[0] if text.startswith("starting engine") else None
        logging.getLogger("gpu_table").info("%s | torch %s", text, self.events[-1]["torch"])

    # the run's progress channel (lab.runs: notify): one level per engine per plan here
    def __call__(self, result) -> None:
        if result.ended_at:
            self._close()
            return
        level = result.levels[-1] if result.levels else None
        if level is not None and level is not self.current and str(level.status) == "running":
            self._close()
            self.current = level
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.reset_peak_memory_stats()
        elif level is self.current and level is not None and str(level.status) != "running":
            self._close()

    def _close(self) -> None:
        if self.current is None:
            return
        level, self.current = self.current, None
        self.levels.append({"engine": level.engine, "users": level.users, "status": str(level.status),
                            "torch": torch_memory(), "nvml": safe(nvml_processes)})


def safe(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a missing reading must not stop the run
        return f"unreadable: {exc}"


async def run(args) -> int:
    from lab.__main__ import format_table
    from lab.config import EngineConfig, LoadConfig, RunPlan
    from lab.runs import write_run
    from lab.session import LabSession, check_session

    began = time.monotonic()
    root, engines = Path(args.root), tuple(args.engines.split(","))
    units = [u for u in parse_plans(args.plans) if not done(unit_dir(root, args.tag, u[0], u[1]))]
    if not units:
        print(f"{args.tag}: every plan is done already")
        return 0
    config = EngineConfig(model=args.model, device=args.device, load_format=args.load_format,
                          kv_cache_gib=args.kv_cache_gib, hf_max_batch_size=args.hf_max_batch_size)
    try:
        check = check_session(config, engines)
    except ValueError as exc:  # the lab's memory planner (or another rule) refused: say it, load nothing
        print(f"error: {exc}")
        return 2
    print(f"{args.tag}: memory plan: " + "; ".join(check.memory.notes))
    recorder = Recorder()
    session = LabSession(config, engines, check)
    failed = 0
    memory_file = root / args.tag / f"memory-{int(time.time())}.json"
    memory_file.parent.mkdir(parents=True, exist_ok=True)

    def save_memory() -> None:
        memory_file.write_text(json.dumps({
            "tag": args.tag, "engines": list(engines), "main_pid": os.getpid(), "start_s": session.start_s,
            "engine_pids": recorder.engine_pids, "events": recorder.events, "levels": recorder.levels,
            "memory_plan": check.memory.to_dict()}, indent=1, default=str))

    try:
        await session.start(recorder.step)
        recorder.step("all engines started")
        save_memory()
        print(f"{args.tag}: engines started in " + ", ".join(f"{k} {v:.0f} s" for k, v in session.start_s.items()))
        for workload, users, rpu in units:
            left = args.deadline_s - (time.monotonic() - began)
            if left < args.min_left_s:
                print(f"{args.tag}: {workload} at {users} users skipped: {left:.0f} s left")
                failed += 1
                continue
            load = LoadConfig(users=(users,), workload=workload, requests_per_user=rpu,
                              output_len=args.output_len, warmup_requests=2)
            plan = RunPlan(engines=engines, load=load, engine=config)
            result = session.new_result(plan)
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(session.run(plan, recorder, result), timeout=left)
            except TimeoutError:
                print(f"{args.tag}: {workload} at {users} users cut at the deadline (kept as .partial)")
            folder = unit_dir(root, args.tag, workload, users)
            if str(result.status) != "ok":
                folder = folder.with_name(folder.name + ".partial")
                failed += 1
            write_run(result, folder)
            print(f"== {args.tag} {workload} users={users} requests/user={rpu} "
                  f"({time.monotonic() - t0:.0f} s, status {result.status})")
            print(format_table(result), flush=True)
            save_memory()
    finally:
        save_memory()
        await session.stop()
    print(f"{args.tag}: {time.monotonic() - began:.0f} s in all")
    return 1 if failed else 0


# -- table --------------------------------------------------------------------------------------

def load_units(root: Path) -> dict[str, dict]:
    """{tag: {(workload, users): summary}} from ROOT/TAG/W-uU/summary.json (partial runs left out)."""
    tags: dict[str, dict] = {}
    for summary in sorted(root.glob("*/*-u*/summary.json")):
        if summary.parent.name.endswith(".partial"):
            continue
        data = json.loads(summary.read_text())
        tags.setdefault(summary.parent.parent.name, {})[(data["workload"], data["users"][0])] = data
    return tags


def model_rows(root: Path, tags: list[str], units: dict) -> dict:
    """{(workload, users): {engine: run dict + requests/user}} merged over the tags of one model."""
    rows: dict = {}
    for tag in tags:
        for key, data in units.get(tag, {}).items():
            for entry in data["runs"]:
                rows.setdefault(key, {})[entry["engine"]] = dict(entry, rpu=data["load"]["requests_per_user"],
                                                                  engine_args=data["engine_args"][entry["engine"]])
    return rows


def ms(value) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}" if value >= 0.1 else f"{value * 1000:,.1f}"


def kv_text(entry: dict) -> str:
    kv = entry.get("kv") or {}
    no_read = "num_blocks" in kv and kv.get("peak_used_blocks") is None  # a pool, but no read saw a request run
    if no_read or entry["engine"] == "hf-cb" and not kv.get("peak_used_blocks"):  # transformers 5.17: no usage
        return f"not read (pool {kv.get('num_blocks') or '?'} x {kv.get('block_size') or '?'})"
    if "peak_used_blocks" in kv:
        return f"{kv['peak_used_blocks']:,} / {kv['num_blocks']:,} x {kv['block_size']}"
    if "peak_reserved_bytes" in kv:
        return f"HF batch {kv['peak_reserved_bytes'] / MIB:,.0f} MiB ({kv['waste_at_peak']:.0%} not real tokens)"
    return "-"


def ratio(rows: dict, top: str, base: str) -> str:
    if top in rows and base in rows and rows[base]["output_tok_s"]:
        return f"{rows[top]['output_tok_s'] / rows[base]['output_tok_s']:.1f}x"
    return "-"


def headline(rows: dict) -> list[str]:
    out = ["| workload | users | req/user | HF static | HF-CB | vLLM served | vLLM engine | served/HF | "
           "engine/HF | served/HF-CB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (workload, users) in sorted(rows, key=lambda k: (k[0] != "mixed", k[1])):
        r = rows[(workload, users)]
        rpu = next(iter(r.values()))["rpu"]
        tok = [f"{r[e]['output_tok_s']:,.0f}" if e in r else "-" for e in ENGINE_ORDER]
        out.append(f"| {workload} | {users} | {rpu} | " + " | ".join(tok) + f" | {ratio(r, 'vllm', 'hf')} | "
                   f"{ratio(r, 'vllm-engine', 'hf')} | {ratio(r, 'vllm', 'hf-cb')} |")
    return out


def detail(rows: dict) -> list[str]:
    out = ["| workload | users | engine | done | output tok/s | TTFT p50 ms | TPOT p50 ms | E2E p90 s | peak KV |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (workload, users) in sorted(rows, key=lambda k: (k[0] != "mixed", k[1])):
        for engine in ENGINE_ORDER:
            e = rows[(workload, users)].get(engine)
            if e is None:
                continue
            e2e = e["e2e_s"]["p90"]
            out.append(f"| {workload} | {users} | {LABEL[engine]} | {e['completed']}/{e['requests']} | "
                       f"{e['output_tok_s']:,.1f} | {ms(e['ttft_s']['p50'])} | {ms(e['tpot_s']['p50'])} | "
                       f"{'-' if e2e is None else f'{e2e:.2f}'} | {kv_text(e)} |")
    return out


def nvml_peaks(root: Path, tag: str) -> list[str]:
    """Peak NVML memory per process over the tag's runs (nvidia-smi every second), named by memory-*.json."""
    peaks: dict[int, tuple[float, str]] = {}
    for sample in sorted(root.glob(f"nvml-{tag}*.csv")):
        with sample.open() as f:
            for row in csv.reader(f):
                try:
                    pid, name, used = int(row[1]), row[2].strip(), float(row[3].strip().split()[0])
                except (IndexError, ValueError):
                    continue
                if used > peaks.get(pid, (0.0, ""))[0]:
                    peaks[pid] = (used, name)
    roles: dict[int, str] = {}
    for memory in sorted((root / tag).glob("memory-*.json")):
        data = json.loads(memory.read_text())
        main = data["main_pid"]
        roles[main] = "lab process: " + ", ".join(
            [LABEL[e] for e in data["engines"] if e in ("hf", "hf-cb")] +
            [f"{LABEL[e]} client" for e in data["engines"] if e in ("vllm", "vllm-engine")])
        for engine, procs in data["engine_pids"].items():
            for proc in procs:
                roles[proc["pid"]] = f"{LABEL.get(engine, engine)} engine core ({proc['name']})"
    lines = ["| pid | process | role | NVML peak MiB |", "|---|---|---|---|"]
    for pid, (used, name) in sorted(peaks.items()):
        lines.append(f"| {pid} | {name} | {roles.get(pid, '?')} | {used:,.0f} |")
    return lines


def torch_breakdown(root: Path, tag: str) -> list[str]:
    """The lab process's CUDA allocator: held after each engine's start, and peak during each engine's levels."""
    lines = []
    for memory in sorted((root / tag).glob("memory-*.json")):
        data = json.loads(memory.read_text())
        events = [e for e in data["events"] if isinstance(e.get("torch"), dict) or e["text"].startswith("starting")]
        held = []
        for before, after in zip(events, events[1:], strict=False):
            if before["text"].startswith("starting engine"):
                name = before["text"].split(": ", 1)[1].split(" ", 1)[0]
                a = (after.get("torch") or {}).get("allocated_mib", 0.0)
                b = (before.get("torch") or {}).get("allocated_mib", 0.0)
                if name in ("hf", "hf-cb"):
                    held.append(f"{LABEL[name]} {a - b:,.0f} MiB")
        peaks: dict[str, float] = {}
        for level in data["levels"]:
            t = level.get("torch")
            if isinstance(t, dict) and level["engine"] in ("hf", "hf-cb"):
                peaks[level["engine"]] = max(peaks.get(level["engine"], 0.0), t["peak_allocated_mib"])
        start = ", ".join(f"{k} {v:.0f} s" for k, v in data["start_s"].items())
        ended = [lv["torch"]["allocated_mib"] for lv in data["levels"] if isinstance(lv.get("torch"), dict)]
        last = ended[-1] if ended else None
        lines.append(f"- `{tag}` ({memory.name}): allocated by each start in the lab process: "
                     f"{'; '.join(held) or '-'}; peak allocated during its levels: "
                     + ("; ".join(f"{LABEL[k]} {v:,.0f} MiB" for k, v in peaks.items()) or "-")
                     + (f"; allocated after the last level (HF-CB allocates its cache and buffers in its own thread "
                        f"after its start returns): {last:,.0f} MiB" if last is not None else "")
                     + f"; start times: {start}")
    return lines


def table(args) -> int:
    root = Path(args.root)
    units = load_units(root)
    models = {}
    for tag in sorted(units):
        models.setdefault(tag.split("-")[0], []).append(tag)
    for model, tags in models.items():
        rows = model_rows(root, tags, units)
        print(f"\n### {model} shape: output tok/s (runs: {', '.join(tags)})\n")
        print("\n".join(headline(rows)))
        print(f"\n#### {model}: latency and KV per engine\n")
        print("\n".join(detail(rows)))
        for tag in tags:
            print(f"\n#### NVML per process, `{tag}` (nvidia-smi once a second, peak)\n")
            print("\n".join(nvml_peaks(root, tag)))
            print()
            print("\n".join(torch_breakdown(root, tag)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_table_report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="load the engines once and run every plan not yet done")
    r.add_argument("--tag", required=True, help="results go to ROOT/TAG/; its first '-' part names the model")
    r.add_argument("--model", default=None)
    r.add_argument("--engines", default=",".join(ENGINE_ORDER))
    r.add_argument("--device", default="cuda")
    r.add_argument("--load-format", default="dummy")
    r.add_argument("--kv-cache-gib", type=float, default=8.0)
    r.add_argument("--hf-max-batch-size", type=int, default=64)
    r.add_argument("--output-len", type=int, default=None, help="force every output length (default: the workload's)")
    r.add_argument("--plans", nargs="+", required=True, help="WORKLOAD:USERS,USERS:REQUESTS_PER_USER ...")
    r.add_argument("--root", default="/tmp/gpu_table")
    r.add_argument("--deadline-s", type=float, default=1e9, help="stop starting plans after this many seconds")
    r.add_argument("--min-left-s", type=float, default=15.0)
    t = sub.add_parser("table", help="print the markdown tables from ROOT")
    t.add_argument("root")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args)) if args.command == "run" else table(args)


if __name__ == "__main__":
    sys.exit(main())
