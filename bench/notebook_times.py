"""How long each guided notebook takes as a learner runs it: a fresh Python process per notebook, as a fresh Jupyter
kernel is, running its code cells top to bottom (lab.notebook.run_notebook), imports and engine starts included.
For docs/workshop.md's tracks (CPU and GPU).

--model and --load-format reach every session the notebooks start: on a GPU without the embedded model's weights, a
config folder with random weights gives the same timings where the cells ask exact lengths (not the same text). A
notebook that fails is timed to its failure and said so, its stderr passed on whole (the engines' log and
tracebacks); the next one runs.
Usage: python -m bench.notebook_times [--notebooks 01,02,...] [--model FOLDER] [--load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def with_model(start, model: str | None, load_format: str | None):
    """lab.notebook.start_session with --model and --load-format set under the notebook's own overrides."""
    fixed = {key: value for key, value in (("model", model), ("load_format", load_format)) if value}

    async def start_session(engines=("hf", "vllm"), **overrides):
        return await start(engines, **(fixed | overrides))

    return start_session


def inside(path: Path, args) -> None:
    """The child: run one notebook; a failure stops its engines and exits 1 with the reason."""
    import lab.notebook

    lab.notebook.start_session = with_model(lab.notebook.start_session, args.model, args.load_format)
    lab.notebook.run_cell = timed(lab.notebook.run_cell)
    loop, namespace = asyncio.new_event_loop(), {}
    try:
        answers = lab.notebook.run_notebook(path, loop, namespace)[1]
        print("\n\n".join(f"== answer {i}\n{getattr(a, 'text', a)}" for i, a in enumerate(answers, 1)), flush=True)
    except Exception as exc:  # noqa: BLE001 - said, then the parent goes on
        if getattr(namespace.get("session"), "engines", None):
            loop.run_until_complete(namespace["session"].stop())
        sys.exit(f"failed: {type(exc).__name__}: {exc}")


CELL_DONE = "code cell done:"


def timed(run_cell):
    """run_cell that says on stderr, as each code cell ends, its number and the seconds since the first began."""
    began, count = time.perf_counter(), itertools.count(1)

    def run(source, namespace, loop, name):
        value = run_cell(source, namespace, loop, name)
        print(f"{CELL_DONE} {next(count)} at {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
        return value

    return run


def time_one(path: Path, args) -> tuple[float, str]:
    """(seconds of the child's whole life, "ok", its last words, or where the limit stopped it)."""
    extra = [f"--{flag}={value}" for flag, value in (("model", args.model), ("load-format", args.load_format)) if value]
    began = time.perf_counter()
    kept = open(Path(args.outputs) / f"{path.stem}.txt", "w") if args.outputs else subprocess.DEVNULL
    child = subprocess.Popen([sys.executable, "-m", "bench.notebook_times", "--inside", str(path), *extra],
                             stdout=kept, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said, limit = child.communicate(timeout=args.limit_s)[1], None
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the notebook's engine processes too
        said, limit = child.communicate()[1], args.limit_s
    if args.outputs:
        kept.close()
    lines = said.strip().splitlines() or ["no output"]
    if limit or child.returncode:  # its whole stderr (a worker thread's traceback too) goes to this one's
        print(f"== {path.name}'s stderr\n{said}", file=sys.stderr, flush=True)
    if limit:
        done = [line for line in lines if line.startswith(CELL_DONE)]
        return time.perf_counter() - began, f"stopped at the {limit:.0f} s limit; {(done or ['no cell ended'])[-1]}"
    return time.perf_counter() - began, "ok" if child.returncode == 0 else lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", default="", help="comma list of numbers (default: every notebook)")
    parser.add_argument("--limit-s", type=float, default=900, help="stop a notebook after this many seconds")
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default=None, choices=("auto", "dummy"))
    parser.add_argument("--outputs", default=None, help="keep each notebook's printed output and computed answers "
                        "in this folder (NN_name.txt)")
    parser.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return inside(Path(args.inside), args)
    from lab.config import EngineConfig
    from lab.environment import read_device

    device = EngineConfig().resolved_device()
    print(f"{read_device(device).name} ({device}), model {args.model or 'embedded'}"
          f"{', random weights' if args.load_format == 'dummy' else ''}; each notebook in a fresh process", flush=True)
    total = 0.0
    if args.outputs:
        Path(args.outputs).mkdir(parents=True, exist_ok=True)
    for path in (p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.notebooks or p.stem[:2] in args.notebooks):
        seconds, status = time_one(path, args)
        total += seconds
        print(f"{path.name:<28} {seconds:>7.1f} s  {status}", flush=True)
    print(f"{'all':<28} {total:>7.1f} s")


if __name__ == "__main__":
    main()
