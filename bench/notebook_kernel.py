"""Each guided notebook executed as a learner's Jupyter runs it: a real kernel (nbclient, which `make notebooks`
installs with JupyterLab), every cell top to bottom, its real stop included. Prints each notebook's time and every
line of engine log noise its outputs hold (WARNING, INFO or DEBUG lines, "force killing", progress bars): what a
learner would see between the answers, by lab.notebook.noise's rule (anything on stderr, any stdout line shaped like
a log record or a warning). The test suite runs the notebooks in its own process with shared engines and
a stubbed stop; this is the check on what a kernel shows.

Usage: python -m bench.notebook_kernel [--notebooks 05,07] [--out DIR] [--timeout-s 900]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lab.notebook import noise

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def outputs_text(notebook) -> tuple[str, str]:
    """What a notebook's executed cells showed, as (stdout, stderr): stderr streams on one side; stdout streams,
    plain text and tracebacks on the other."""
    out, err = [], []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            shown = output.get("text") or output.get("data", {}).get("text/plain")
            side = err if output.get("name") == "stderr" else out
            side.append(str(shown or "\n".join(output.get("traceback", []))))
    return "\n".join(out), "\n".join(err)


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
    return time.perf_counter() - began, status, noise(*outputs_text(notebook))


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
