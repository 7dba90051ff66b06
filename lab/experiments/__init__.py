"""KV-cache experiments: why paged KV wins, each measured on the engines of a running session.

One module per experiment, each named with one line in ``EXPERIMENTS``. Each has a ``Params``
dataclass validated on construction (ValueError naming the value and the limit, before any engine is
touched), ``check(params, config)`` for the rules that need the engine config too (before loading), and
``async run(session, params, result, notify)`` that fills an ExperimentResult as it goes: the
measured ``fields`` (named as docs/cli.md lists them), ``rows`` for a CSV, ``series`` for its figure, and
the live load run where there is one. The CLI (``python -m lab experiment NAME``), the dashboard's
KV cache tab and the notebooks all call ``run_experiment`` and draw with lab.plots.kv.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lab.config import decimal, whole, whole_or_none
from lab.environment import read_device, versions
from lab.runs import RunResult
from lab.status import RunStatus
from lab.tasks import TaskResult, TaskSpec, supervise

log = logging.getLogger(__name__)

EXPERIMENTS = {
    "cache": "why a KV cache: ms per token with and without it as the sequence grows, and its bytes per token",
    "waste": "KV memory held vs holding real tokens, by kind of waste: HF's batches, HF's static cache, vLLM's blocks",
    "blocks": "vLLM's KV pool as a grid of blocks per request, derived and checked against vLLM's count",
    "table": "vLLM's real block table: the block ids each request holds, freed, reused and shared, read from vLLM",
    "prefix": "a long shared block first vs last in the prompt: prefix-cache hit rate and TTFT",
    "phases": "prefill-bound vs decode-bound work at several user levels: what concurrency buys",
    "preemption": "a deliberately small KV pool under many users: vLLM's preemptions, against a normal pool",
    "sharing": "parallel sampling (n=4) of one prompt vs four separate requests: shared KV blocks",
    "memory": "the memory plan: vLLM's fraction of TOTAL memory and what it buys in KV blocks",
    "why": "the vLLM/HF ratio taken apart: one mechanism per rung, measured on the same requests",
}
OWN_TAB = ("why",)  # experiments with a tab of their own: the KV cache tab does not list them
PREDICTS = {"why": "step"}  # the experiments the room predicts: the kind of their round (lab.predictions.TASKS)


def module(name: str):
    """The experiment's module (lab.experiments.NAME)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"lab.experiments.{name}")


@dataclass(frozen=True)
class ExperimentPlan:
    """One experiment to run: its name and its validated Params (what the host's submit and the CLI's runner take)."""

    name: str
    params: Any


def parse_params(name: str, values: dict[str, Any]) -> Any:
    """The experiment's Params from loose values (CLI strings, form numbers), validated.

    Args:
        name: Experiment name.
        values: Field name -> value; strings are converted to the field's type ('1,5' for tuples).

    Returns:
        A validated Params instance.

    Raises:
        ValueError: unknown field, unconvertible value, or a value past its limit.
    """
    params_cls = module(name).Params
    known = {f.name: f for f in dataclasses.fields(params_cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{name}: unknown parameter {unknown[0]!r}; known: {', '.join(known)}")
    converted = {k: _convert(k, v, str(known[k].type)) for k, v in values.items() if v not in (None, "")}
    return params_cls(**converted)


def parse_pairs(text: str) -> dict[str, str]:
    """``'users=4 output_len=24'`` -> ``{'users': '4', 'output_len': '24'}``.

    Pairs are split on whitespace only, so a comma stays inside its value (``users=1,5`` is one tuple);
    a comma trailing a pair (``users=4, output_len=24``) is dropped.

    Raises:
        ValueError: a word that is not key=value, or a key given twice.
    """
    values: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.rstrip(",").partition("=")
        if not sep or not key:
            raise ValueError(f"{word!r} is not key=value (pairs are separated by spaces: users=1,5 output_len=24)")
        if key in values:
            raise ValueError(f"{key} is given twice")
        values[key] = value
    return values


def validate(name: str, params: Any, config) -> None:
    """Every rule that needs the engine config too (lengths vs max_model_len, block sizes), before loading.

    Raises:
        ValueError: naming the value and the limit.
    """
    module(name).check(params, config)


def _convert(key: str, value: Any, annotation: str) -> Any:
    """A loose value as the field's annotated type ('int | None', 'tuple[int, ...]', 'float', 'str'), through
    lab.config's rules (whole numbers refuse fractions and non-ASCII digits; numbers refuse nan and inf)."""
    if annotation.startswith("tuple"):
        parts = value.replace(",", " ").split() if isinstance(value, str) else list(
            value if isinstance(value, (list, tuple)) else [value])
        if not parts or any(whole_or_none(v) is None for v in parts):
            raise ValueError(f"{key}: {value!r} is not a list of whole numbers like 1,5")
        return tuple(whole_or_none(v) for v in parts)
    if annotation.startswith("bool"):
        return _flag(key, value)
    if annotation.startswith("int"):
        return _one(key, value, whole, "whole number")
    if annotation.startswith("float"):
        return _one(key, value, decimal, "number")
    return value


def _flag(key: str, value: Any) -> bool:
    """true/yes/on/1 or false/no/off/0, in any case; anything else is refused by name, never read as false."""
    word = str(value).strip().lower()
    if isinstance(value, bool) or word in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value if isinstance(value, bool) else word in ("true", "yes", "on", "1")
    raise ValueError(f"{key}: {value!r} is not true or false (yes/no, on/off, 1/0)")


def _one(key: str, value: Any, rule, kind: str) -> Any:
    """One value through a lab.config rule, refused as '{key}: {value!r} is not a {kind}'."""
    try:
        return rule(value, key)
    except ValueError:
        raise ValueError(f"{key}: {value!r} is not a {kind}") from None


@dataclass(kw_only=True)
class ExperimentResult(TaskResult):
    """One experiment, live while it runs and kept (partial) when it fails or is cancelled."""

    KIND: ClassVar[str] = "experiment"

    experiment: str
    params: Any
    fields: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    series: dict = field(default_factory=dict)
    run: RunResult | None = None  # the load run underneath, for live views

    def name(self) -> str:
        """The experiment's name."""
        return self.experiment

    def to_dict(self) -> dict:
        """As experiment.json holds it."""
        return {"experiment": self.experiment, "experiment_id": self.id, "started_at": self.started_at,
                "ended_at": self.ended_at, "status": self.status, "error": self.error,
                "params": dataclasses.asdict(self.params), "model": self.model, "device": self.device,
                "engine_args": self.engine_args, "versions": self.versions, **self.fields, "series": self.series}


HELD = ("experiment", "experiment_id", "started_at", "ended_at", "status", "error", "params", "model", "device",
        "engine_args", "versions", "series")  # what every experiment.json holds beside its measured fields


def stored_fields(data: dict) -> dict:
    """The measured fields of an experiment.json dict (the memory plan's ``device`` is one: its device's name)."""
    return {k: v for k, v in data.items() if k not in HELD or k == "device" and isinstance(v, str)}


def new_result(session, name: str, params: Any) -> ExperimentResult:
    """An empty result stamped with the session's model, device, engine args and versions."""
    return ExperimentResult(experiment=name, params=params, model=session.check.model,
                            device=read_device(session.check.device).to_dict(), versions=versions(),
                            engine_args={n: i.args for n, i in session.info.items()})


async def run_experiment(session, name: str, params: Any, result: ExperimentResult | None = None,
                         on_update=None) -> ExperimentResult:
    """Run one experiment on a started session; never loses what it measured.

    Args:
        session: A started LabSession (the engines the experiment needs must be loaded).
        name: Experiment name.
        params: Its validated Params.
        result: The result to fill (created by the caller to watch it live), else a new one.
        on_update: Called with the result whenever it changed (progress).

    Returns:
        The result with status ok, failed (error set) or cancelled.
    """
    validate(name, params, session.config)
    result = result or new_result(session, name, params)
    notify = on_update or (lambda r: None)
    return await supervise(result, module(name).run(session, params, result, notify), notify,
                           lambda: salvage(session, name, result))


def ended(run: RunResult) -> None:
    """Raise what stopped a load run underneath an experiment (execute() keeps it as data)."""
    if run.status == RunStatus.CANCELLED:
        raise asyncio.CancelledError
    if run.status == RunStatus.FAILED:
        raise RuntimeError(run.error)


def salvage(session, name: str, result: ExperimentResult) -> None:
    """Compute the fields of a load run that stopped early from the levels it finished or began."""
    fill = getattr(module(name), "fill", None)
    if fill is None or result.run is None or result.fields:
        return
    try:
        fill(session, result)
    except Exception:
        log.exception("experiment %s stopped before it measured enough to fill its fields", name)


def write_experiment(result: ExperimentResult, out_dir: str | Path, stem: str = "experiment") -> dict[str, Path]:
    """Write DIR/STEM.json and, where rows fit a table, DIR/STEM.csv (stem: experiment, or explain for the ladder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json"}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=2, default=str))
    if result.rows:
        paths["csv"] = out / f"{stem}.csv"
        with paths["csv"].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(result.rows[0]))
            writer.writeheader()
            writer.writerows(result.rows)
    return paths


def session_engines(plan: ExperimentPlan, config) -> tuple[str, ...]:
    """The engines the CLI's session loads for an experiment: its module's ``engines(params, config)`` where they
    depend on the settings (the Why ladder), else its ENGINES."""
    found = module(plan.name)
    return found.engines(plan.params, config) if hasattr(found, "engines") else found.ENGINES


TASK = TaskSpec(kind="experiment", plan=ExperimentPlan,
                check=lambda plan, config, session: validate(plan.name, plan.params, config),
                new=lambda session, plan: new_result(session, plan.name, plan.params),
                run=lambda session, plan, result, notify: run_experiment(session, plan.name, plan.params, result,
                                                                         notify),
                write=write_experiment, engines=session_engines,
                started=lambda result: f"Experiment {result.experiment} ({result.id}) started.", write_live=True,
                predicts=lambda plan: PREDICTS.get(plan.name))
