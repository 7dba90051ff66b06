"""The CLI's one runner: the engines its session loads come from the jobs' kinds (lab.tasks), and a task goes to the
history by the one checkpoint rule the page's host uses too (lab.store). Pure: nothing loads here."""

from __future__ import annotations

import logging

from lab.__main__ import Job, said, session_engines
from lab.capacity import capacity_plan
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.experiments import ExperimentPlan
from lab.experiments.why import Params, preset_config
from lab.memory import model_kv_bytes_per_token
from lab.model import resolve_model
from lab.status import RunStatus
from lab.store import keep, save_at_checkpoint
from lab.sweeps import sweep_plan
from lab.tasks import TaskResult

CONFIG = EngineConfig(device="cpu", load_format="dummy")


def job(plan) -> Job:
    return Job(plan, "unused", print, said("test"))


def test_the_session_loads_the_engines_the_jobs_kinds_name_in_the_order_first_named():
    run = RunPlan(engines=("vllm", "hf"), load=LoadConfig(users=(1,)), engine=CONFIG)
    sweep = sweep_plan("hf_max_batch_size", "1,2", "1", "equal", 1, 4)
    search = capacity_plan("ttft_p95=5s", ("hf-cb",), CONFIG)
    assert session_engines(CONFIG, [job(sweep)]) == ("hf",)
    assert session_engines(CONFIG, [job(run), job(sweep), job(search)]) == ("vllm", "hf", "hf-cb")
    assert session_engines(CONFIG, [job(ExperimentPlan("prefix", {}))]) == ("vllm",)


def test_a_ladder_loads_hf_and_vllm_only_where_the_session_runs_its_presets_settings():
    memory = Params(preset="memory", repeats=1)
    per_token = model_kv_bytes_per_token(resolve_model(CONFIG.model), CONFIG.resolved_dtype())
    preset = preset_config(memory, CONFIG, per_token)
    assert session_engines(preset, [job(ExperimentPlan("why", memory))]) == ("hf", "vllm")
    assert session_engines(CONFIG, [job(ExperimentPlan("why", memory))]) == ()  # every rung starts its own


def test_a_task_is_stored_each_time_its_checkpoint_moves():
    stored, result = [], TaskResult()
    mark = save_at_checkpoint(result, None, stored.append)
    assert mark is None and stored == []  # running: nothing to store yet
    result.status = RunStatus.OK
    mark = save_at_checkpoint(result, mark, stored.append)
    assert save_at_checkpoint(result, mark, stored.append) == RunStatus.OK
    assert stored == [result]  # once per checkpoint


class Ended(TaskResult):
    def to_dict(self) -> dict:
        return {}


def test_a_store_that_fails_is_logged_and_never_fails_the_task(tmp_path, caplog):
    result = Ended(status=RunStatus.OK)
    with caplog.at_level(logging.ERROR, logger="lab.store"):
        keep(tmp_path, result)  # a folder is no database
    assert f"could not store task {result.id}" in caplog.text
