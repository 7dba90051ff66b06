"""Shared fixtures: a tiny tokenizer for unit tests, real engines for integration tests."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ("tests.ui_kit",)  # the browser tests' fixtures (served app, Chromium, room), one place for both files

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class CharTokenizer:
    """A stand-in tokenizer for unit tests of workloads and the driver: one id per character."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 1000 for c in text]


@pytest.fixture
def char_tokenizer():
    return CharTokenizer()


def running_session(config, engines=("hf", "vllm")):
    """A started LabSession on its own event loop (``session.loop``), stopped when the generator ends.

    Modules that load the real engines wrap it in a module-scoped fixture:
    ``yield from running_session(CONFIG)``.
    """
    import asyncio

    from lab.session import LabSession

    loop = asyncio.new_event_loop()
    session = LabSession(config, engines)
    loop.run_until_complete(session.start())
    session.loop = loop
    yield session
    loop.run_until_complete(session.stop())
    loop.close()


# `make test` runs all but the browser and app files in two workers (pytest-xdist, --dist loadfile
# --no-loadscope-reorder): each file whole on one of them, the files of unit tests only first, then the slowest
# files first (the notebooks, ~12 minutes on one worker, are two files, one per worker), so that one worker's
# vLLM start (imports in a new process, single-threaded) overlaps the other's engines. A worker takes its next file
# when two tests of its current one are left, so the files that come last should be short ones: test_why.py (one
# test of ~2 minutes, the CLI ladder on every CPU rung) comes before the rest. Then the browser and app files run in two
# workers of their own, away from the engines' load: their limits are times. The two browser files (each with its
# own served app) start first, one per worker; the app's file follows on the first to finish. Beside each other
# they run 1.4-2x slower than alone, within their limits; an engine file's worker beside them broke their
# time-outs, and the app's two starts beside an engine file broke that file's cancel check (each layout's time:
# docs/results/cpu-epyc-2core/README.md, "CI's time").
SLOWEST_FILES = ("test_notebooks.py", "test_notebooks_more.py", "test_engines.py", "test_experiments.py",
                 "test_why.py", "test_sweeps.py", "test_serve.py", "test_ui.py", "test_ui_tabs.py")


def bind_vllm_to_this_worker() -> None:
    """Under xdist, this worker's vLLM computes on its own share of the CPUs (vLLM's automatic binding would
    put every worker's vLLM on the same core); a binding set outside is kept."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cpus = sorted(os.sched_getaffinity(0))
    index, share = int(worker.removeprefix("gw")), max(1, len(cpus) // int(count))
    mine = cpus[index * share % len(cpus):][:share]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))


bind_vllm_to_this_worker()


def pytest_collection_modifyitems(config, items):
    """Run unit tests first, then the slow ones that load real engines, then the browser ones; under xdist
    (each file one unit of work), the files of unit tests only first, then the slowest files first."""
    order = {"slow": 1, "ui": 2}

    def rank(item):
        return max((order[m.name] for m in item.iter_markers() if m.name in order), default=0)

    items.sort(key=rank)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        heavy = {item.path.name for item in items if rank(item)}

        def weight(item):
            name = item.path.name
            if name not in heavy:
                return -1  # files of unit tests only: first, before any engine ran in the worker (as without xdist)
            return SLOWEST_FILES.index(name) if name in SLOWEST_FILES else len(SLOWEST_FILES)

        items.sort(key=weight)  # stable: within a file, the order above
