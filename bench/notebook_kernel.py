"""Each guided notebook executed as a learner's Jupyter runs it: a real kernel (nbclient, which `make notebooks`
installs with JupyterLab), every cell top to bottom, its real stop included. Prints each notebook's time and every
line of engine log noise its outputs hold (WARNING, INFO or DEBUG lines, "force killing", progress bars): what a
learner would see between the answers. The test suite runs the notebooks in its own process with shared engines and
a stubbed stop; this is the check on what a kernel shows.

Usage: python -m bench.notebook_kernel [--notebooks 05,07] [--out DIR] [--timeout-s 900]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NOISE = re.compile(r"\b(WARNING|INFO|DEBUG)\b|force killing|it/s\]|\d+%\|")


def outputs_text(notebook) -> list[str]:
    """Every line a notebook's executed cells show: streams, plain text and tracebacks."""
    lines = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            shown = output.get("text") or output.get("data", {}).get("text/plain")
            lines += str(shown or "\n".join(output.get("traceback", []))).splitlines()
    return lines


def noise(lines: list[str]) -> list[str]:
    return [line for line in lines if NOISE.search(line)]


def execute(path: Path, out: Path, timeout_s: float) -> tuple[float, str, list[str]]:
    """(seconds, "ok" or the error's last line, noise lines); the executed copy is written to ``out``."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    began, status = time.perf_counter(), "ok"
    client = nbclient.NotebookClient(notebook, timeout=timeout_s, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - said, and the next notebook runs
        words = str(exc).strip()
        status = f"failed: {words.splitlines()[-1] if words else type(exc).__name__}"
    nbformat.write(notebook, out / path.name)
    return time.perf_counter() - began, status, noise(outputs_text(notebook))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", default="", help="comma list of numbers (default: every notebook)")
    parser.add_argument("--out", default="notebook-kernel", help="where the executed copies go")
    parser.add_argument("--timeout-s", type=float, default=900, help="a cell's limit")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in (p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.notebooks or p.stem[:2] in args.notebooks):
        seconds, status, found = execute(path, out, args.timeout_s)
        print(f"{path.name:<28} {seconds:>7.1f} s  {status}  noise lines: {len(found)}", flush=True)
        for line in found[:10]:
            print(f"    {line[:160]}", flush=True)


if __name__ == "__main__":
    main()
