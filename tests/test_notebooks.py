"""The notebooks run top to bottom against the real engines (their code cells, in one namespace)."""

import ast
import asyncio
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("*.ipynb"))


def run_cells(path: Path) -> dict:
    """Execute every code cell like a kernel with top-level await would; returns the namespace."""
    namespace: dict = {}
    loop = asyncio.new_event_loop()
    try:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            code = compile(source, f"{path.name}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            outcome = eval(code, namespace)
            if asyncio.iscoroutine(outcome):
                loop.run_until_complete(outcome)
    finally:
        loop.close()
    return namespace


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    namespace = run_cells(path)
    if "summary" in namespace:
        summary = namespace["summary"]
        assert summary["status"] == "ok" and set(summary["ratio"]) == {"1", "5"}
    for name in ("waste", "blocks", "prefix"):  # 02's experiments measured something
        if name in namespace:
            assert namespace[name].status == "ok" and namespace[name].fields, namespace[name].error
    assert not namespace["session"].engines  # the last cell stopped the engines
