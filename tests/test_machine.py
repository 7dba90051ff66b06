"""A busy machine is measured and said: other processes' CPU and steal during each level (lab.metrics.machine), and
the captions that set an inverted or straddling ratio beside that figure instead of stating it flatly."""

import asyncio

from lab.config import LoadConfig, RunPlan
from lab.engines.fake import FakeEngine
from lab.metrics.levels_words import noise_line, ratio_caption
from lab.metrics.machine import (
    Sample,
    between,
    disturbed,
    parse_process,
    parse_stat,
    sample,
    tree_ticks,
)
from lab.metrics.steps_words import shared_lines
from lab.runs import RunResult, execute, summary_dict

# Read on the 2-core AMD EPYC of docs/results/cpu-estimates.md while other helpers' tests ran on it.
STAT = """cpu  1527742 3648 136614 704374 15145 0 1587 2755 0 0
cpu0 707910 1948 59397 419122 5499 0 247 1376 0 0
cpu1 819831 1700 77217 285251 9645 0 1340 1379 0 0
intr 1 2 3
"""
PROCESS = ("4242 (VLLM::Engine (core) 0) S 4200 4200 11066 0 -1 4194304 101 0 0 0 1500 300 20 7 20 0 1 0 1200085 "
           "3133440 413 18446744073709551615 0 0")
QUIET = {"others_cores": 0.04, "steal_cores": 0.0, "lab_cores": 1.9, "cores": 2, "seconds": 6.1}
BUSY = {"others_cores": 0.9, "steal_cores": 0.02, "lab_cores": 1.1, "cores": 2, "seconds": 9.8}
STOLEN = {"others_cores": 0.05, "steal_cores": 0.3, "lab_cores": 1.6, "cores": 2, "seconds": 7.0}


def test_the_kernels_counters_are_read_by_kind_and_a_process_by_its_last_parenthesis():
    assert parse_stat(STAT) == (1527742 + 3648 + 136614 + 1587, 2755, 1527742 + 3648 + 136614 + 1587 + 704374
                                + 15145 + 2755, 2)
    assert parse_process(PROCESS) == (4242, 4200, 1500 + 300 + 20 + 7)  # its own time and its reaped children's
    found = {1: (0, 500), 10: (1, 100), 11: (10, 40), 12: (11, 2), 20: (1, 900)}
    assert tree_ticks(found, 10) == 142 and tree_ticks(found, 20) == 900 and tree_ticks(found, 99) == 0


def test_other_processes_are_the_machines_busy_time_less_the_labs_own():
    before = Sample(wall_s=100.0, busy=10_000, steal=50, total=30_000, lab=4_000, cores=2)
    after = Sample(wall_s=110.0, busy=11_900, steal=60, total=32_000, lab=4_950, cores=2)
    found = between(before, after, hertz=100)
    assert found == {"others_cores": 0.95, "steal_cores": 0.01, "lab_cores": 0.95, "cores": 2, "seconds": 10.0}
    assert disturbed(found)
    assert between(before, None) is None and between(after, before) is None


def test_one_rule_calls_a_level_disturbed():
    assert not disturbed(QUIET) and disturbed(BUSY) and disturbed(STOLEN)  # steal: 15% of the machine
    assert not disturbed(None) and not disturbed({})


def test_other_processes_on_idle_cores_of_a_large_host_do_not_disturb_a_level():
    # the H200 host of docs/results/h200-notebooks (16 cores): a second notebook's process beside the lab's
    beside = {"others_cores": 1.4, "steal_cores": 0.0, "lab_cores": 1.2, "cores": 16, "seconds": 30.0}
    crowded = {"others_cores": 14.2, "steal_cores": 0.0, "lab_cores": 1.7, "cores": 16, "seconds": 30.0}
    assert not disturbed(beside) and disturbed(crowded)


def row(engine, users, tok_s, repeat=0, machine=None):
    found = {"engine": engine, "users": users, "repeat": repeat, "output_tok_s": tok_s,
             "tpot_s": {"p50": 0.03 if engine == "hf" else 0.02}}
    return found | ({"machine": machine} if machine else {})


def summary(rows):
    from lab.metrics import ratios_by_users

    return {"runs": rows, "ratio": {str(u): r for u, r in ratios_by_users(rows).items()}}


def test_a_disturbed_levels_inverted_ratio_is_said_with_the_machines_figure():
    """The issue's case: on a busy machine a level read 0.89x; the caption says so flatly."""
    quiet = [row("hf", 3, 100, machine=QUIET), row("vllm", 3, 230, machine=QUIET)]
    busy = [row("hf", 8, 200, machine=QUIET), row("vllm", 8, 178, machine=BUSY)]
    caption = ratio_caption(summary(quiet + busy))
    assert "At 3 users: vLLM made 2.30x" in caption and "At 8 users: vLLM made 0.89x" in caption
    line = noise_line(summary(quiet + busy), 8)
    assert line == ("The machine was shared: other processes used up to 0.04 of the 2 cores during HF's turns and "
                    "0.90 during vLLM's (measured), so this level's 0.89x may be the machine, not the engines.")
    assert line in caption and noise_line(summary(quiet), 3) == ""


def test_repeats_that_straddle_1_are_said_and_a_quiet_loss_is_the_engines():
    straddle = [row("hf", 4, 100, 0, QUIET), row("vllm", 4, 90, 0, QUIET),
                row("hf", 4, 100, 1, QUIET), row("vllm", 4, 115, 1, QUIET)]
    assert noise_line(summary(straddle), 4) == "Its repeats straddle 1 (0.90-1.15x, n=2): no measured gain or loss."
    loss = [row("hf", 1, 100, 0, QUIET), row("vllm", 1, 84, 0, QUIET),
            row("hf", 1, 100, 1, QUIET), row("vllm", 1, 86, 1, QUIET)]
    assert noise_line(summary(loss), 1) == ("The machine was quiet (other processes used at most 0.04 of the 2 cores, "
                                            "measured): vLLM lost here.")
    unsampled = [row("hf", 1, 100), row("vllm", 1, 84)]  # a run stored before the lab sampled the machine
    assert "not ruled out" in noise_line(summary(unsampled), 1)
    stolen = [row("hf", 2, 100, machine=STOLEN), row("vllm", 2, 150, machine=QUIET)]
    assert "the hypervisor took 0.30 cores (steal)" in noise_line(summary(stolen), 2)


def test_the_factors_caption_says_a_disturbed_level_and_is_silent_on_a_quiet_one():
    level = {"base": "hf", "top": "vllm"}
    busy = summary([row("hf", 8, 200, machine=BUSY), row("vllm", 8, 178, machine=BUSY)])
    assert shared_lines(busy, 8, level) == [
        "The machine was shared during this level: other processes used up to 0.90 of the 2 cores during HF's turns "
        "and 0.90 during vLLM's (measured), so its factors may be the machine's, not the engines'."]
    assert shared_lines(summary([row("hf", 8, 200, machine=QUIET), row("vllm", 8, 600, machine=QUIET)]), 8,
                        level) == []


def test_each_level_samples_this_machine(char_tokenizer, monkeypatch):
    """The real sampler, on this machine: each level stores its figures (no timed assertion: the numbers are
    whatever the machine did)."""
    found = sample()
    assert found is not None and found.cores >= 1 and found.lab > 0 and found.total >= found.busy
    monkeypatch.setattr("lab.runs.SETTLE_S", 0)
    monkeypatch.setattr("lab.runs.hardware", lambda result: {})  # the copy-bandwidth probe: not this test's
    engines = {"hf": FakeEngine("hf"), "vllm": FakeEngine("vllm")}
    plan = RunPlan(engines=("hf", "vllm"), load=LoadConfig(users=(2,), requests_per_user=1, output_len=4,
                                                           warmup_requests=0))
    result = RunResult(plan=plan, model="fake", model_path="fake", device={"kind": "cpu"}, versions={})
    result.engine_info = {name: asyncio.run(engine.start()) for name, engine in engines.items()}
    asyncio.run(execute(plan, engines, char_tokenizer, result))
    for run in summary_dict(result)["runs"]:
        machine = run["machine"]
        assert machine["cores"] == found.cores and machine["seconds"] > 0
        assert min(machine["others_cores"], machine["steal_cores"], machine["lab_cores"]) >= 0
