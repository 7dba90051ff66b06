"""The why ladder: its arithmetic and its sentences on recorded runs that disagree (pure, fast), its inputs refused
before anything loads, and `python -m lab explain` on the real engines (CPU)."""

import json
import math
import subprocess
import sys

import pytest

from lab.experiments import parse_params
from lab.experiments.ladder import check_rungs, decompose, largest
from lab.experiments.why_words import why_caption
from lab.metrics.levels_words import ratio_caption

# Two recorded ladders (tok/s per repeat) whose largest step differs: on a GPU-like run CUDA graphs lead,
# on a CPU-like spread run continuous batching does.
GRAPHS_LEAD = {"hf": [1000, 1050, 980], "hf-cb": [800, 760, 820], "vllm-eager": [1300, 1350, 1280],
               "vllm": [7300, 7000, 7400], "hf-compiled": [4000, 4100, 3900], "offline": [8600, 8500, 8800]}
BATCHING_LEADS = {"hf": [60, 58, 61], "hf-cb": [150, 140, 155], "vllm": [190, 185, 200], "vllm-engine": [200, 190, 205]}


def fields(tok_s, device, users=4, budget=None, peaks=None):
    """explain.json's fields for recorded tok/s, as lab.experiments.why.fill makes them."""
    rungs = {n: {"label": n, "status": "ran", "reason": "", "tok_s": v, "tpot_ms": [], "tpot_ms_median": 20.0,
                 "peak_running": (peaks or {}).get(n, [])} for n, v in tok_s.items()}
    return {"preset": "spread", "preset_words": "test load", "load": {"users": users}, "budget": budget,
            "rungs": rungs, **decompose(tok_s, device)}


@pytest.mark.parametrize("tok_s, device", [(GRAPHS_LEAD, "cuda"), (BATCHING_LEADS, "cpu")])
def test_the_chain_multiplies_to_vllm_over_hf_and_each_factor_has_its_spread(tok_s, device):
    found = decompose(tok_s, device)
    assert math.isclose(found["product"], found["total"]["value"], rel_tol=1e-9)
    for f in found["factors"]:
        ratios = [u / lo for lo, u in zip(tok_s[f["lower"]], tok_s[f["upper"]], strict=True)]
        assert f["low"] == min(ratios) and f["high"] == max(ratios) and f["n"] == 3


def test_a_skipped_rung_merges_its_step_and_a_cpu_has_no_graphs_step():
    cpu = decompose(BATCHING_LEADS, "cpu")
    assert [(f["lower"], f["upper"]) for f in cpu["factors"]] == [("hf", "hf-cb"), ("hf-cb", "vllm")]
    engine = "vLLM's engine (its scheduler, block manager and batching loop, on transformers' model code)"
    assert cpu["factors"][1]["mechanism"] == f"{engine} + vLLM's model code and kernels"  # no compile or graphs
    gpu = decompose({"hf": [10], "hf-cb": [12], "vllm": [60]}, "cuda")  # the rungs between skipped on a GPU
    every = (f"{engine} + vLLM's model code and kernels + torch.compile (vLLM's compilation) + per-step overhead "
             f"(CUDA graphs)")
    assert gpu["factors"][1]["mechanism"] == every
    opened = decompose({"hf": [10], "hf-cb": [12], "vllm-hf-code": [15], "vllm": [30]}, "cpu")
    assert [f["mechanism"] for f in opened["factors"]][1:] == [engine, "vLLM's model code and kernels"]
    assert [s["upper"] for s in cpu["sides"]] == ["vllm-engine"] and not cpu["sides"][0]["in_product"]


@pytest.mark.parametrize("tok_s, device, step", [(GRAPHS_LEAD, "cuda", "vllm-eager → vllm"),
                                                  (BATCHING_LEADS, "cpu", "hf → hf-cb")])
def test_the_caption_names_the_largest_step_of_its_own_run(tok_s, device, step):
    text = why_caption(fields(tok_s, device))
    big = largest(decompose(tok_s, device)["factors"])
    assert f"{big['lower']} → {big['upper']}" == step
    assert f"({step}) gave the most: {big['value']:.2f}x" in text
    assert f"vLLM made {decompose(tok_s, device)['total']['value']:.2f}x HF's output tok/s" in text


def test_the_caption_follows_the_measured_signs_and_premises():
    loss = fields({"hf": [50, 52], "hf-cb": [30, 31], "vllm": [100, 98]}, "cpu", users=1)
    text = why_caption(loss)
    assert "(a loss)" in text and "a step took 20.0 ms in HF" in text  # 1 user: step times, no batching claim
    unsure = why_caption(fields({"hf": [50, 60], "hf-cb": [55, 54], "vllm": [100, 98]}, "cpu"))
    assert "x (its repeats straddle 1: no measured gain or loss) from continuous" in unsure
    assert "a step took" not in unsure
    budget = {"hf_cap": 3, "tokens": 480, "longest_request": 160}
    more = why_caption(fields(BATCHING_LEADS, "cpu", budget=budget, peaks={"vllm": [8, 7, 8]}))
    same = why_caption(fields(BATCHING_LEADS, "cpu", budget=budget, peaks={"vllm": [3, 2, 3]}))
    assert "ran up to 8 at once in the same tokens (measured), more than HF's cap" in more
    assert "ran up to 3 at once in the same tokens (measured), no more than HF's cap" in same
    assert why_caption({"total": None}).startswith("Nothing to compare yet")
    merged = why_caption(fields({"hf": [30, 36], "vllm-eager": [56, 42], "vllm": [155, 155]}, "cuda", users=1))
    assert ("from vLLM's engine (its scheduler, block manager and batching loop, on transformers' model code) + "
            "vLLM's model code and kernels (at 1 user nothing is batched) (hf → vllm-eager)") in merged


@pytest.mark.parametrize("values, words", [
    ({"preset": "fast"}, "unknown preset 'fast'"),
    ({"repeats": "0"}, "repeats must be a whole number from 1 to 10, not 0"),
    ({"repeats": "1.5"}, "repeats: '1.5' is not a whole number"),
    ({"rungs": "hf,warp,vllm"}, "unknown rung 'warp'"),
    ({"rungs": "hf,hf-cb"}, "vllm is needed"),
])
def test_bad_ladder_parameters_are_refused_by_name(values, words):
    with pytest.raises(ValueError, match=words):
        parse_params("why", values)


def test_rungs_come_back_in_ladder_order():
    assert check_rungs(["vllm", "offline", "hf"]) == ("hf", "vllm", "offline")


def explain(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "lab", "explain", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, words", [
    (["--preset", "fast"], "unknown preset 'fast'"),
    (["--repeats", "0"], "repeats must be a whole number"),
    (["--rungs", "hf,vllm,turbo"], "unknown rung 'turbo'"),
])
def test_explain_refuses_bad_input_with_exit_2_before_loading(args, words, tmp_path):
    done = explain(*args, "--out", str(tmp_path / "x"), timeout=60)
    assert done.returncode == 2 and words in done.stderr and not (tmp_path / "x").exists()
    assert "starting engine" not in done.stderr


@pytest.mark.slow
def test_explain_overhead_on_this_cpu_writes_every_rung_that_runs_here(tmp_path, capsys):
    """Every CPU rung through the CLI's main in this process (its imports are this process's; `python -m lab
    explain` itself runs in the refusal tests above), one turn each (a second turn cost CI ~21 s of CPU): the
    repeats' spread and their interleaving are notebook 07's (two repeats) and the Why tab's cancel test's to check."""
    from lab.__main__ import main

    code = main(["explain", "--preset", "overhead", "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "explain.json").read_text())
    ran = [n for n, r in data["rungs"].items() if r["status"] == "ran"]
    assert ran == ["hf", "hf-cb", "vllm-hf-code", "vllm", "vllm-engine", "offline"]  # every rung a CPU can run
    assert {data["rungs"][n]["status"] for n in ("hf-compiled", "vllm-eager", "vllm-compiled")} == {"skipped"}
    assert data["rungs"]["vllm-hf-code"]["flags"] == "--model-impl transformers --enforce-eager"
    assert all(len(data["rungs"][n]["tok_s"]) == 1 for n in ran)
    assert math.isclose(data["product"], data["total"]["value"], rel_tol=0.01)
    assert all(f["n"] == 1 and f["low"] == f["value"] == f["high"] for f in data["factors"] + data["sides"])
    assert data["caption"] in out and "vllm / hf:" in out and "one repeat: no spread" in data["caption"]
    assert len((tmp_path / "explain.csv").read_text().splitlines()) == 1 + len(ran)


def level(engine, users, tok_s, tpot_ms):
    return {"engine": engine, "users": users, "output_tok_s": tok_s, "tpot_s": {"p50": tpot_ms / 1000}}


def test_the_ratio_caption_names_each_levels_step_times_and_says_why_only_where_the_run_shows_it():
    one = {"ratio": {"1": 2.2}, "runs": [level("hf", 1, 30, 33.0), level("vllm", 1, 66, 15.0)]}
    text = ratio_caption(one)
    assert "At 1 user: vLLM made 2.20x HF's output tok/s; median time per output token 33.0 ms in HF, 15.0 ms" in text
    assert "nothing is batched or paged" in text and "**Why** tab" in text
    four = ratio_caption({"ratio": {"4": 3.1}, "runs": [level("hf", 4, 60, 40.0), level("vllm", 4, 186, 20.0)]})
    assert "At 4 users: vLLM made 3.10x" in four and "nothing is batched" not in four
    assert ratio_caption({"ratio": {}, "runs": []}) == ""


def test_a_headline_never_names_a_step_whose_repeats_straddle_1():
    """Notebook 07's case: at 1 user hf -> hf-cb read 1.44x with repeats straddling 1, and the headline named it."""
    from lab.experiments.why_words import largest_words

    batching = {"lower": "hf", "upper": "hf-cb", "mechanism": "continuous batching", "value": 1.44, "low": 0.8,
                "high": 2.1, "n": 3}
    kernels = {"lower": "hf-cb", "upper": "vllm", "mechanism": "vLLM's engine", "value": 1.3, "low": 1.2,
               "high": 1.4, "n": 3}
    said = largest_words([batching, kernels])
    assert "**hf-cb → vllm**" in said and "hf → hf-cb" not in said
    assert largest_words([batching]) == "no step stands out: every step's repeats straddle 1"


def test_the_session_reuses_its_own_engine_keeps_a_rungs_and_stops_one_that_fails_to_start(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    import lab.session
    from lab.config import EngineConfig
    from lab.engines.fake import FakeEngine

    class Broken(FakeEngine):
        async def start(self):
            raise RuntimeError("no backend here")

        async def stop(self):
            stopped.append(self.name)

    stopped, config = [], EngineConfig(device="cpu", load_format="dummy")
    made = {"vllm": FakeEngine, "hf": Broken}
    monkeypatch.setattr(lab.session, "create_engine", lambda name, config, path: made[name](name))
    session = lab.session.LabSession(config, ("vllm",), check=SimpleNamespace(model_path="m"))
    own = FakeEngine("vllm")
    session.engines["vllm"], session.configs["vllm"] = own, config
    eager = config.with_overrides(enforce_eager=True)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(session.rung("vllm", config.with_overrides(gpu_memory_utilization=0.5))) is own
    kept = loop.run_until_complete(session.rung("vllm-eager", eager))
    assert kept is not own and loop.run_until_complete(session.rung("vllm-eager", eager)) is kept
    with pytest.raises(RuntimeError, match="no backend"):
        loop.run_until_complete(session.rung("hf-compiled", config))
    assert stopped == ["hf"] and list(session.rungs) == [("vllm-eager", eager)]
    loop.run_until_complete(session.release_rungs())
    assert session.rungs == {}
    loop.close()


def test_the_ladder_reads_each_rungs_facts_from_its_entry():
    from lab.experiments.ladder import RUNGS
    from lab.experiments.why import _pooled

    assert [n for n in RUNGS if RUNGS[n].optional] == ["vllm-hf-code", "vllm-compiled"]
    assert [n for n in RUNGS if _pooled(n)] == ["vllm-hf-code", "vllm-eager", "vllm-compiled", "vllm", "vllm-engine",
                                                "offline"]  # started first, their share of a card asked for
    offline = RUNGS["offline"]
    assert (offline.family, offline.whole_batch, RUNGS["hf-compiled"].fits_load) == ("vllm", True, True)
