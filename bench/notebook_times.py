"""How long each guided notebook takes as a learner runs it: its code cells top to bottom (lab.notebook.run_notebook),
each notebook starting and stopping its own engines, as in Jupyter. For docs/workshop.md's tracks (CPU and GPU).

--model and --load-format reach every session the notebooks start: on a GPU without the embedded model's weights, a
config folder with random weights gives the same timings (not the same text). A notebook that fails is timed to its
failure and said so; its engines are stopped and the next one runs.
Usage: python -m bench.notebook_times [--notebooks 01,02,...] [--model FOLDER] [--load-format dummy]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def with_model(start, model: str | None, load_format: str | None):
    """lab.notebook.start_session with --model and --load-format set under the notebook's own overrides."""
    fixed = {key: value for key, value in (("model", model), ("load_format", load_format)) if value}

    async def start_session(engines=("hf", "vllm"), **overrides):
        return await start(engines, **(fixed | overrides))

    return start_session


def time_one(path: Path, loop: asyncio.AbstractEventLoop) -> tuple[float, str]:
    """(seconds, "ok" or why it failed); a failed notebook's engines are stopped."""
    from lab.notebook import run_notebook

    namespace, began = {}, time.perf_counter()
    try:
        run_notebook(path, loop, namespace)
        return time.perf_counter() - began, "ok"
    except Exception as exc:  # noqa: BLE001 - the next notebook still runs
        seconds = time.perf_counter() - began
        if getattr(namespace.get("session"), "engines", None):
            loop.run_until_complete(namespace["session"].stop())
        return seconds, f"failed: {type(exc).__name__}: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", default="", help="comma list of numbers (default: every notebook)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default=None, choices=("auto", "dummy"))
    args = parser.parse_args()
    chosen = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.notebooks or p.stem[:2] in args.notebooks]
    import lab.notebook
    from lab.config import EngineConfig
    from lab.environment import read_device

    device = EngineConfig().resolved_device()
    lab.notebook.start_session = with_model(lab.notebook.start_session, args.model, args.load_format)
    print(f"{read_device(device).name} ({device}), model {args.model or 'embedded'}"
          f"{', random weights' if args.load_format == 'dummy' else ''}", flush=True)
    loop, total = asyncio.new_event_loop(), 0.0
    for path in chosen:
        seconds, status = time_one(path, loop)
        total += seconds
        print(f"{path.name:<28} {seconds:>7.1f} s  {status}", flush=True)
    print(f"{'all':<28} {total:>7.1f} s")


if __name__ == "__main__":
    main()
