"""What the guided notebooks share: starting a session, predictions, and answers that stay collapsed.

Every notebook in ``notebooks/`` follows one shape: learn, **predict**, run, look, **explain**, exercise, and an
answer that computes from the run's own numbers. ``answer()`` renders as a collapsed ``<details>`` block in Jupyter
(click to open) and as plain text anywhere else; ``against()`` puts the learner's prediction beside the figure,
labelled measured or computed by lab.words.labels' one rule; ``story()`` closes a notebook with its finding placed in
the story the notebooks tell (lab.words.story). ``noise()`` says which lines of a notebook's output an engine or a
library wrote (the notebook tests and bench.notebook_kernel check there are none). ``run_notebook()`` runs one without
Jupyter (its tests, bench.notebook_times), optionally as a learner who set its knobs (top-level ``NAME = value``
lines) to other values would. Nothing here computes a metric: the numbers come from lab.metrics, lab.experiments and
lab.sweeps, the same the dashboard and the CLI show.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from lab.config import EngineConfig
from lab.engines.registry import default_names
from lab.session import LabSession
from lab.words.labels import kind, label


@dataclass(frozen=True)
class Answer:
    """A worked answer: collapsed in a notebook, plain text when printed."""

    text: str
    title: str = "Answer (click to open): computed from this run"

    def _repr_markdown_(self) -> str:
        return f"<details><summary><b>{self.title}</b></summary>\n\n{self.text}\n\n</details>"

    def __str__(self) -> str:
        return self.text


def answer(*lines: str) -> Answer:
    """An Answer from markdown lines (one paragraph each)."""
    return Answer("\n\n".join(lines))


def story(sentence: str) -> Answer:
    """A notebook's closing answer: its finding placed in the story the notebooks tell (lab.words.story)."""
    return Answer(sentence, title="Where this fits in the story (click to open): computed from this run")


def against(prediction, value: float, unit: str = "", origin: str = "engine") -> str:
    """The learner's prediction beside the figure, labelled measured or computed by its ``origin``
    (lab.words.labels.ORIGINS: "engine" for what an engine reported; "formula", "shape" or "arithmetic" for what the lab
    worked out); a blank prediction says so."""
    shown = f"{value:,.3g}{unit}" if isinstance(value, float) else f"{value:,}{unit}"
    if prediction is None:
        return f"{label(origin)}: **{shown}** (you left your prediction blank)."
    return f"You predicted **{prediction}{unit}**; {kind(origin)}: **{shown}**."


@dataclass(frozen=True)
class Note:
    """Lines shown open under a cell (markdown bullets in a notebook, plain lines when printed)."""

    lines: tuple[str, ...]

    def _repr_markdown_(self) -> str:
        return "\n".join(f"- {line}" for line in self.lines)

    def __str__(self) -> str:
        return "\n".join(self.lines)


QUIET_ENV = {  # set before the engines load; their processes inherit it
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's INFO and WARNING lines (start-up, "force killing" at stop)
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings (NUMA binding)
    "PYTHONWARNINGS": "ignore",  # FutureWarnings of the engine processes
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


QUIET_CHILDREN = str(Path(__file__).with_name("quiet"))  # on PYTHONPATH: its sitecustomize quiets vLLM's children


def quiet_engines() -> None:
    """Keep the engines' log lines and warnings out of a learner's cells (errors still show), in this process and
    in those the engines start (QUIET_ENV, QUIET_CHILDREN); the app and the CLI keep their logs."""
    import os
    import warnings

    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([QUIET_CHILDREN] + [p for p in paths if p != QUIET_CHILDREN])
    warnings.filterwarnings("ignore")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its import-time warnings come before its logging is set up
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


LOG_LINE = re.compile(  # what a log record or a library's warning looks like, whoever wrote it
    r"^\s*(\([\w-]+ pid=\d+\)\s*)?\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b"  # a level first (a child's prefix)
    r"|^\s*\[?[DIWEF]\d{4} \d\d:\d\d"  # glog and torch's C++ logs: W1128 12:00:00
    r"|\d\d-\d\d \d\d:\d\d:\d\d|\[[\w./-]+\.py:\d+\]"  # vLLM's timestamp, a [file.py:123] origin
    r"|\b\w+(Warning|Error):|force killing|it/s\]|\d+%\|")  # warnings, vLLM's stop, progress bars


def noise(out: str, err: str = "") -> list[str]:
    """The lines of a notebook's output that an engine or a library wrote, not the notebook: every line on stderr
    (the cells write nothing there, and an error shows as its traceback) and every stdout line shaped like a log
    record or a warning (LOG_LINE)."""
    return [line for line in err.splitlines() if line.strip()] + [
        line for line in out.splitlines() if LOG_LINE.search(line)]


GPU_KV_GIB = 0.25  # on a GPU, vLLM's KV budget in the notebooks: the CPU's pool (11,650 tokens of SmolLM2), which
#                   their GPU-sized loads fill; half a card's memory would hold millions of tokens and never fill
GPU_HF_BATCH = 128  # on a GPU, HF's static batch holds every user of the notebooks' GPU levels (03's exercise: 128),
#                     as the lab's default 32 holds a CPU's: with batches of 32, 03's 128-user level took four rounds
#                     of HF steps, and the notebook ran past 530 s on an H200


def on_gpu() -> bool:
    """Whether the engines will run on CUDA: the notebooks then take their GPU sizes (more users, a set KV budget)."""
    return EngineConfig().resolved_device() == "cuda"


async def start_session(engines: tuple[str, ...] = default_names(), **overrides) -> LabSession:
    """Load the embedded model on ``engines`` with the lab's defaults plus ``overrides`` (EngineConfig's
    fields), the engines' log lines kept out of the cells; with two engines the agreement check runs too
    (``session.agreement``). On a GPU vLLM's KV budget is GPU_KV_GIB and HF's batch GPU_HF_BATCH unless
    ``overrides`` set them."""
    quiet_engines()
    if on_gpu():
        overrides.setdefault("hf_max_batch_size", GPU_HF_BATCH)
        if "gpu_memory_utilization" not in overrides:
            overrides.setdefault("kv_cache_gib", GPU_KV_GIB)
    session = LabSession(EngineConfig(**overrides), engines)
    await session.start()
    return session


def verdicts(session: LabSession) -> Note:
    """How the engines agree (the start-up check), or why there was nothing to check: the last line of a cell, so
    that the notebook shows it."""
    return Note(tuple(session.agreement.verdicts() if session.agreement else ["one engine loaded: nothing to compare"]))


# -- running a notebook without Jupyter (its tests, bench.notebook_times) ----------------------------------------
def run_cell(source: str, namespace: dict, loop: asyncio.AbstractEventLoop, name: str):
    """Execute one cell as a kernel with top-level await would; returns the value of its last line when that is an
    expression (what Jupyter shows)."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    value = None
    for part, mode in ((tree, "exec"), (ast.Expression(last.value) if last else None, "eval")):
        if part is None:
            continue
        code = compile(part, name, mode, flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        value = eval(code, namespace)
        if asyncio.iscoroutine(value):
            value = loop.run_until_complete(value)
    return value


def run_notebook(path: Path, loop: asyncio.AbstractEventLoop, namespace: dict | None = None,
                 knobs: dict | None = None) -> tuple[dict, list]:
    """Run every code cell on ``loop`` in one namespace (``namespace``, if given, which keeps what the cells made
    should one fail), as a learner who set ``knobs`` would (set_knobs); returns the namespace and the values of the
    answer cells."""
    namespace = {} if namespace is None else namespace
    answers = []
    for cell in code_cells(path, knobs or {}):
        value = run_cell("".join(cell["source"]), namespace, loop, path.name)
        if "answer" in cell["metadata"].get("tags", []):
            answers.append(value)
    return namespace, answers


def code_cells(path: Path, knobs: dict) -> list[dict]:
    """The notebook's code cells, each top-level ``NAME = ...`` of a name in ``knobs`` set to its value instead
    (a learner's edit); a knob that no cell assigns is refused (ValueError), so that a renamed one is not silently
    left at the learner's size."""
    cells = [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
    edited = [set_knobs("".join(cell["source"]), knobs) for cell in cells]
    missing = set(knobs) - set().union(*(names for _, names in edited))
    if missing:
        raise ValueError(f"{path.name}: no cell assigns {', '.join(sorted(missing))}")
    return [cell | {"source": source} for cell, (source, _) in zip(cells, edited, strict=True)]


def set_knobs(source: str, knobs: dict) -> tuple[str, set]:
    """``source`` with the value of each top-level ``NAME = value`` whose NAME is in ``knobs`` replaced by the knob's
    (its repr; a comment after it kept), and the names it replaced."""
    lines, found = [line.encode() for line in source.splitlines(keepends=True)], set()  # ast's offsets: bytes
    assigns = [node for node in ast.parse(source).body if isinstance(node, ast.Assign) and len(node.targets) == 1
               and isinstance(node.targets[0], ast.Name) and node.targets[0].id in knobs]
    for node in reversed(assigns):  # from the last, so that earlier offsets stay right
        value, name = node.value, node.targets[0].id
        first, last = lines[value.lineno - 1], lines[value.end_lineno - 1]
        lines[value.lineno - 1:value.end_lineno] = [
            first[:value.col_offset] + repr(knobs[name]).encode() + last[value.end_col_offset:]]
        found.add(name)
    return b"".join(lines).decode(), found
