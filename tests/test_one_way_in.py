"""One way in: every task kind (a run, an experiment, a sweep, the Why ladder, a capacity search) goes through the
host's one ``submit`` and the CLI's one runner, and each ends in the history (lab.store) the same way.

The plumbing is what is tested here, so the engines are lab.engines.fake's (instant, on the real tokenizer of the
embedded model and the real session, runs, sweeps, ladder and search); the real engines walk the same paths in
tests/test_ui.py, tests/test_ui_tabs.py, tests/test_why.py and tests/test_capacity.py.
"""

from __future__ import annotations

import pytest

import lab.capacity
import lab.experiments.why
import lab.runs
import lab.session
from lab.capacity import capacity_plan
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.experiments import ExperimentPlan, parse_params
from lab.status import RunStatus
from lab.store import list_stored
from lab.sweeps import sweep_plan
from lab.tasks import KINDS, spec_of

CONFIG = EngineConfig(device="cpu", load_format="dummy")


def plans() -> dict[str, object]:
    """One small request of every kind, by the name the test gives it."""
    load = LoadConfig(users=(1,), workload="equal", requests_per_user=1, output_len=4, warmup_requests=0)
    return {
        "run": RunPlan(engines=("hf", "vllm"), load=load, engine=CONFIG),
        "experiment": ExperimentPlan("phases", parse_params("phases", {"users": "1", "decode_output_len": "4"})),
        "sweep": sweep_plan("hf_max_batch_size", "1,2", "1", "equal", 1, 4),
        "ladder": ExperimentPlan("why", lab.experiments.why.Params(repeats=1, rungs="hf,vllm")),
        "capacity": capacity_plan("ttft_p95=5s", ("hf",), CONFIG, max_users=2, requests_per_user=1, min_requests=1,
                                  output_len=4, warmup=0),
    }


@pytest.fixture
def fake_engines(monkeypatch, tmp_path):
    """Every engine a fake one; no settling between engines; the history in tmp_path."""
    make = lambda name, config, model_path: FakeEngine(name)  # noqa: E731
    monkeypatch.setattr(lab.session, "create_engine", make)
    for module in (lab.runs, lab.experiments.why, lab.capacity):
        monkeypatch.setattr(module, "SETTLE_S", 0)
    db = tmp_path / "results.sqlite"
    monkeypatch.setattr("lab.store.default_db_path", lambda: db)
    return db


def stored_kinds(db) -> dict[str, str]:
    """The history's ids -> their kind and name."""
    return {row["id"]: f"{row['kind']}:{row['name']}" for row in list_stored(db)}


def test_the_table_names_every_kind_and_a_request_names_its_own():
    assert {spec_of(plan).kind for plan in plans().values()} == set(KINDS)
    with pytest.raises(ValueError, match="no task kind takes a str"):
        spec_of("waste")


def test_every_kind_goes_through_the_one_submit_and_is_stored(fake_engines):
    from lab.app.host import LabHost

    host = LabHost(CONFIG, ("hf", "vllm"), fake_engines)
    host.start_loading()
    try:
        assert host.wait_ready(60), host.status.text()
        for name, plan in plans().items():
            started, message = host.submit(plan)
            assert started, (name, message)
            assert not host.submit(plan)[0]  # the one busy rule: one task at a time
            host.runner.wait(60)
            task = host.task
            assert task.status == RunStatus.OK, (name, task.error)
            assert host.last(spec_of(plan).kind) is task
            assert stored_kinds(fake_engines)[task.id].startswith(task.KIND), name
    finally:
        host.close()


def test_every_kind_goes_through_the_one_cli_runner_and_is_stored(fake_engines, tmp_path, capsys):
    from lab.__main__ import Job, run_jobs, said

    for name, plan in plans().items():
        job = Job(plan, str(tmp_path / name), lambda result: print(result.id), said(name),
                  ("explain",) if name == "ladder" else ())
        assert run_jobs(CONFIG, [job]) == 0, name
        task_id = capsys.readouterr().out.split()[0]
        assert stored_kinds(fake_engines)[task_id].startswith(spec_of(plan).kind), name
        assert any((tmp_path / name).iterdir()), name
