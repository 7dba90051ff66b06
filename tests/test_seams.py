"""The lab's seams hold: no import cycle inside lab/, one engine registry that every face reads, and a remote
host that forwards exactly what the Host seam declares."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lab.app import seam
from lab.app.host import LabHost
from lab.app.host_process import RemoteHost
from lab.engines import registry

LAB = Path(__file__).resolve().parents[1] / "lab"


def lab_modules() -> dict[str, Path]:
    """Every module of lab/ by its dotted name (a package by its own name)."""
    found = {}
    for path in LAB.rglob("*.py"):
        parts = path.relative_to(LAB.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The lab modules ``name`` imports anywhere in it (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base] * bool(base))
            subs = {f"{base}.{a.name}" for a in node.names} & set(known)
            out |= subs or {base}
    return {_owner(target, known) for target in out if target.startswith("lab")} - {name, None}


def _owner(target: str, known: dict) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n, [n]))), None)


def test_no_import_cycle_inside_lab_even_through_function_level_imports():
    known = lab_modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the walk finds one


@pytest.fixture
def fake_kind():
    spec = registry.register(registry.EngineSpec("toy", "Toy", "lab.engines.fake:FakeEngine", "a toy engine",
                                                 color="#123456"))
    yield spec
    del registry.ENGINES["toy"]


def test_a_registered_engine_reaches_the_cli_the_page_and_the_plans(fake_kind):
    from lab.__main__ import build_parser
    from lab.app.dashboard import engine_choices
    from lab.config import EngineConfig, LoadConfig, RunPlan

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    assert "toy (a toy engine)" in " ".join(bench.format_help().split())
    assert ("Toy", "toy") in engine_choices(("hf", "toy", "vllm"))
    assert RunPlan(engines=("toy",), load=LoadConfig(users=(1,))).engines == ("toy",)
    assert "toy" in EngineConfig().engine_names() and registry.label("toy") == "Toy"


def test_the_registry_builds_by_name_and_refuses_what_it_does_not_know():
    from lab.config import EngineConfig, parse_endpoint

    config = EngineConfig(endpoints=(parse_endpoint("srv=http://127.0.0.1:9"),))
    assert type(registry.create_engine("srv", config, "m")).__name__ == "OpenAIEngine"
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        registry.create_engine("nope", config, "m")
    assert registry.with_pool(("hf", "vllm", "vllm-engine", "hf-cb")) == ["vllm", "vllm-engine"]


def test_the_remote_host_forwards_exactly_the_seam(tmp_path):
    from lab.app.host_process import COPIED, SYNCED
    from lab.config import EngineConfig

    declared = set(seam.ATTRIBUTES) | {n for k in ("command", "ask", "read", "local") for n in seam.members(k)}
    host = LabHost(EngineConfig(device="cpu"), db_path=tmp_path / "results.sqlite")
    try:  # the host holds every declared attribute; a sync brings every one not fixed or mirrored, and every read
        assert all(hasattr(host, name) for name in seam.ATTRIBUTES)
        assert set(COPIED) | set(seam.FIXED) | set(seam.MIRRORED) == set(seam.ATTRIBUTES)
        assert set(SYNCED) - set(COPIED) == set(seam.members("read"))
    finally:
        host.close()
    remote = RemoteHost.__new__(RemoteHost)
    vars(remote).update({name: None for name in seam.ATTRIBUTES})
    assert seam.public(remote) == declared
    for name in declared - set(seam.ATTRIBUTES):
        params = list(inspect.signature(getattr(seam.Host, name)).parameters)
        assert callable(getattr(LabHost, name)), name
        assert list(inspect.signature(getattr(LabHost, name)).parameters)[: len(params)] == params, name


def test_the_page_types_against_the_seam():
    for module in ("ui", "ui_kv", "ui_predict", "ui_sweep", "ui_why"):
        text = (LAB / "app" / f"{module}.py").read_text()
        assert "from lab.app.seam import Host" in text and "LabHost" not in text, module
