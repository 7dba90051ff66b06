"""The guided notebooks run top to bottom against the real engines (their code cells, in one namespace, as a
kernel with top-level await would), each in the shape the learner follows, every answer computed.

This file runs the notebooks of HALF; tests/test_notebooks_more.py runs the rest with the checks here, so that
CI's two workers (one file each) share the ~10 minutes they take. Where a test proves that a notebook runs and
computes every answer, not the size of its run, it runs the notebook as a learner who set its knobs smaller would
(KNOBS); the learner's sizes are timed by bench/notebook_times.py."""

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.config import EngineConfig
from lab.experiments import ExperimentResult
from lab.experiments.cache import growth
from lab.experiments.ladder import largest
from lab.experiments.waste_words import ROW_LABELS, block_size_answer
from lab.notebook import Answer, code_cells, noise, run_notebook, set_knobs
from lab.sweeps import SweepResult
from lab.words import gain_words
from lab.words.labels import kind, reported
from lab.words.story import level_words

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("*.ipynb"))
SHAPE = ("What you will learn", "Predict", "Explain", "Exercise")
HALF = ("02", "03", "05")  # about half of the ~12 minutes they take on 2 cores (the other file: 01, 04, 06, 07)
KNOBS = {  # a learner's edits the tests make (CI's time); where a spread is checked, two repeats give it a low and high
    "01_hf_vs_vllm": {"REPEATS": 1},  # one turn: a load test's spreads and its starred levels are the Workshop
    #                 demo's browser test's to check (4 repeats); 01's answers and story are checked here
    "03_concurrency": {"REPEATS": 2, "USERS": "1,2", "ANSWER_LEN": 24},  # still a step from 1 user to more; the
    #                  decode runs' answers cut to 24 tokens, as test_experiments' phases test has them (-34 s alone)
    "04_sweeps": {"REPEATS": 2, "USERS": "2"},  # 2 users still queue behind max_num_seqs=1 and HF's batch of 1
    "07_why_vllm_wins": {"REPEATS": 2, "EXERCISE_PRESET": "overhead"},  # a second ladder, of the cheapest preset
}


class Borrowed:
    """A shared session as one notebook sees it: everything is the session's, except that ``engines`` reads only
    the engines the notebook asked for, and its closing ``stop()`` only marks this notebook done (``engines`` then
    reads empty, as after a real stop)."""

    def __init__(self, session, engines):
        vars(self).update(_session=session, _engines=tuple(engines), _stopped=False)

    def __getattr__(self, name):
        if name == "engines":
            return {} if self._stopped else {n: e for n, e in self._session.engines.items() if n in self._engines}
        return getattr(self._session, name)

    def __setattr__(self, name, value):
        setattr(self._session, name, value)

    async def stop(self) -> None:
        vars(self)["_stopped"] = True


def shared_sessions():
    """One event loop, and started sessions shared by every notebook of this module. A learner's notebook starts
    and stops its own engines; here a notebook gets a session already started with the same settings and at least
    its engines (a vLLM start is 13-35 s on 2 cores, mostly imports in a new process: CI's time), else a new one;
    all are stopped at the module's end. Each level resets vLLM's prefix cache, so no notebook inherits another's
    cached blocks."""
    from lab.notebook import quiet_engines
    from lab.session import LabSession

    loop, sessions = asyncio.new_event_loop(), {}

    async def start_session(engines=("hf", "vllm"), **overrides):
        settings = tuple(sorted(overrides.items()))
        key = next((k for k in sessions if k[1] == settings and set(engines) <= set(k[0])), None)
        if key is None:
            quiet_engines()
            key = (tuple(engines), settings)
            sessions[key] = LabSession(EngineConfig(**overrides), engines)
            await sessions[key].start()
        return Borrowed(sessions[key], engines)

    yield loop, start_session
    for session in sessions.values():
        loop.run_until_complete(session.stop())
    loop.close()


_shared = pytest.fixture(scope="module", name="shared")(shared_sessions)


def test_the_path_is_numbered_and_every_notebook_has_the_learners_shape():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert all(word in text for word in SHAPE), path.name
        first_code = next("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert first_code.startswith("SMALL = True"), path.name
        hidden = [c for c in cells if "answer" in c["metadata"].get("tags", [])]
        assert len(hidden) >= 2 and all(c["metadata"]["jupyter"]["source_hidden"] for c in hidden), path.name


def notebooks(first_half: bool) -> list:
    return [path for path in NOTEBOOKS if (path.stem[:2] in HALF) == first_half]


@pytest.mark.slow
@pytest.mark.parametrize("path", notebooks(first_half=True), ids=lambda p: p.name)
def test_notebook_runs_and_every_answer_is_computed(path, capfd, shared, monkeypatch):
    check_notebook(path, capfd, shared, monkeypatch)


def labelled(monkeypatch) -> list[tuple[str, object]]:
    """Every (origin, value) the notebook's cells put a Measured or Computed label on (lab.notebook.against)."""
    import lab.notebook

    said, real = [], lab.notebook.against

    def against(prediction, value, unit="", origin="engine"):
        said.append((origin, value))
        return real(prediction, value, unit, origin)

    monkeypatch.setattr(lab.notebook, "against", against)
    return said


def engine_reported(namespace: dict) -> set:
    """Every number an engine reported that the notebook's results hold (lab.words.labels.reported)."""
    found = set()
    for value in namespace.values():
        if isinstance(value, ExperimentResult):
            found.update(reported(value.fields, value.experiment))
        elif isinstance(value, SweepResult):
            found.update(reported(value.points, "sweep"))
        elif isinstance(value, dict) and "runs" in value and "ratio" in value:  # a load test's summary
            found.update(reported(value, "run"))
    return found


def check_notebook(path, capfd, shared, monkeypatch) -> None:
    """Run one notebook on the shared sessions; every answer computed, and each the branch its run calls for."""
    loop, start_session = shared
    monkeypatch.setattr("lab.notebook.start_session", start_session)
    said = labelled(monkeypatch)
    namespace, answers = run_notebook(path, loop, knobs=KNOBS.get(path.stem))
    out, err = capfd.readouterr()  # what the cells and the engines' processes printed
    assert not noise(out, err), noise(out, err)[:20]
    measured = engine_reported(namespace)  # every "Measured" label sits on a figure an engine reported
    assert all(value in measured for origin, value in said if kind(origin) == "measured"), said
    assert answers and all(isinstance(a, Answer) for a in answers), answers
    for a in answers:
        assert "nan" not in str(a).lower().split() and any(ch.isdigit() for ch in str(a)), str(a)
        assert a._repr_markdown_().startswith("<details>")
    assert not namespace["session"].engines  # the last cell stopped the engines
    if path.stem == "07_why_vllm_wins":  # two loads, two ladders: each answer names its own ladder's largest step
        for result, said in ((namespace["overhead"], answers[0]), (namespace["spread"], answers[1])):
            big = largest(result.fields["factors"])
            assert f"largest step is **{big['lower']} → {big['upper']}**, {big['value']:.2f}x" in str(said)
            assert result.fields["caption"] in str(said)
            assert level_words(result.fields["load"]["users"], result.fields["steps"]) in str(answers[-1])
    if path.stem == "01_hf_vs_vllm":  # the exercise's answer says grew or shrank as its own two ratios did
        a, b = (float(namespace[name]["ratio"][str(namespace["TOP"])]) for name in ("summary", "exercise"))
        assert f"{'grew' if b > a else 'shrank'} from {a:.2f}x" in str(answers[1])
        top = str(namespace["TOP"])  # the closing story names the factor that made the busy level's lead
        assert level_words(int(top), namespace["summary"]["factors"][top]) in str(answers[-1])
    if path.stem == "02_paged_attention":  # each answer's branch is the one its run's numbers call for
        table = namespace["table"].fields  # ids read from vLLM's KV cache manager, not derived from token counts
        assert "get_block_ids" in table["source"] and table["most_at_once"] >= 4
        assert table["non_contiguous"] and table["reused"] and table["shared"]
        counts = namespace["blocks"].fields  # the derived count against vLLM's: the side that counted more named
        said = next(str(a) for a in answers if "engine steps the two counts" in str(a))
        assert not counts["max_abs_diff_blocks"] or ("vLLM counted more" if counts["vllm_ahead"] else
                                                    "the derived count counted more") in said
        grew = growth(namespace["cache"].fields, "without cache")
        assert f"{grew:.1f}x" in str(answers[0])
        for result, said in ((namespace["waste"], answers[-3]), (namespace["again"], answers[-2])):
            hf, vllm = (result.fields[e]["waste_pct"]["mean"] for e in ("hf", "vllm"))
            assert f"{'HF' if hf > vllm else 'vLLM'} wasted more here" in str(said)
            kept = {e: result.fields[e]["kinds_pct"]["real"] for e in ROW_LABELS if e in result.fields}
            assert f"{ROW_LABELS[max(kept, key=kept.get)]} kept the largest share" in str(said)
        check_block_sizes(namespace["waste"].fields, str(answers[-3]), str(answers[-1]))
    if path.stem == "03_concurrency":  # gained or lost, as each measured gain says
        hf = namespace["result"].fields["decode"]["hf"]
        assert hf["gain_spread"]["n"] == namespace["REPEATS"]
        assert f"HF {gain_words(hf['gain'], hf['gain_spread'])}" in str(answers[0])
        check_capacity_exercise(namespace, answers)
    if path.stem == "04_sweeps":  # the queue's answer is the one its own TTFT and TPOT call for
        first, last, u = namespace["first"], namespace["last"], namespace["u"]
        ttft, tpot = (first[f"{k}@{u}"] / last[f"{k}@{u}"] for k in ("ttft_p50_s", "tpot_p50_s"))
        assert ("the queue cost first tokens more" if ttft > tpot * 1.2 else "did not show in TTFT") in str(answers[0])
        n = namespace["REPEATS"]  # the spread is printed
        assert first[f"output_tok_s_spread@{u}"]["n"] == n and f", n={n})" in str(answers[0])
    if path.stem == "05_prefix_caching":  # which order found more cached, and whether TTFT moved beyond its spread
        fields = namespace["result"].fields
        first, last, spread = fields["first"]["hit_rate"], fields["last"]["hit_rate"], fields["ttft_ratio_spread"]
        said = "So the constant-first order found" if first > last else "found no more cached"
        assert said in str(answers[0]) and spread["n"] == 3
        straddle = spread["low"] <= 1 <= spread["high"]
        assert ("the repeats straddle 1" in str(answers[0])) == straddle
        blocks = namespace["short"].fields["first"]["computed"]["full_blocks"]
        assert ("fill no full block" if blocks == 0 else "still fill") in str(answers[1])
    if path.stem == "06_sharing_a_gpu":  # shared or not, as the measured peaks say
        s = namespace["s"]
        shared = s["n=4 in one request"]["peak_blocks"] < s["unshared_blocks_estimate"]
        assert ("fewer blocks than unshared copies" if shared else "nothing was shared") in str(answers[1])
        preempted = namespace["preemption"].fields["small"]["preemptions"]
        assert ("vLLM preempted one" if preempted else "nothing was preempted") in str(answers[2])
    if path.stem == "04_sweeps":  # its block-size sweep really changed the block, and the pool with it
        blocks = namespace["blocks"].points
        assert [p["kv_block_size"] for p in blocks] == [64, 128]
        assert abs(blocks[0]["kv_total_blocks"] - 2 * blocks[1]["kv_total_blocks"]) <= 1


def check_capacity_exercise(namespace: dict, answers: list) -> None:
    """03's exercises: the step to more users judged on its own repeats (a verdict only where none straddles the
    line), and the capacity search's sentences and the prediction's, each from its probes (both engines probed)."""
    from lab.capacity import capacity_answer
    from lab.capacity.words import guess_line
    from lab.experiments.phases_words import kept_growing, step_of

    more, users = namespace["more"]["vllm"], (namespace["most"], namespace["EXERCISE_USERS"])
    assert more["step_spread"]["n"] == namespace["REPEATS"]  # each repeat against the first run's same repeat
    verdict = kept_growing(step_of(namespace["decode"]["vllm"], more), users)
    assert {True: "so it kept growing", False: "so it flattened", None: "cannot say whether"}[verdict] in str(
        answers[1])
    capacity = namespace["capacity"]
    assert {p["engine"] for p in capacity["probes"]} == {"hf", "vllm"} and capacity["status"] == "ok"
    said = str(answers[2])
    assert guess_line(None, capacity["ratios"]["vllm/hf"]) in said and all(
        line in said for line in capacity_answer(capacity))


def check_block_sizes(fields: dict, said: str, story: str) -> None:
    """02 on a CPU: vLLM ran in blocks of 32 and of 128 (measured), 16 was computed; the waste answer names what
    the smaller block did to the waste and to the requests the same pool holds at once, and the story says it."""
    rows = fields["block_sizes"]
    assert {kind(rows[size]["origin"]) for size in ("32", "128")} == {"measured"} and rows["16"]["origin"] == "formula"
    small, large = rows["32"], rows["128"]
    effect = "wasted less" if small["waste_pct"] < large["waste_pct"] else "wasted no less"
    fits = f"holds {small['requests_at_once']} such requests at once against {large['requests_at_once']}"
    assert f"Smaller blocks {effect}" in said and fits in said
    assert all(line in said for line in block_size_answer(fields))
    more = small["requests_at_once"] - large["requests_at_once"]
    assert (f"{more} more at once" if more > 0 else "no more at once") in said
    assert f"hold {small['requests_at_once']} requests of this run at once instead of {large['requests_at_once']}" \
        in story


def test_on_a_gpu_the_notebooks_session_takes_the_gpu_pool_and_batch_unless_set(monkeypatch):
    """On CUDA a notebook's session gets a KV budget its GPU-sized runs fill and an HF batch that holds its most
    users; a value the notebook sets wins, and a CPU keeps the lab's defaults."""
    import lab.notebook

    made = []

    class Recorded:
        def __init__(self, config, engines):
            made.append(config)

        async def start(self):
            pass

    monkeypatch.setattr(lab.notebook, "LabSession", Recorded)
    for gpu in (True, False):
        monkeypatch.setattr(lab.notebook, "on_gpu", lambda gpu=gpu: gpu)
        asyncio.run(lab.notebook.start_session())
        asyncio.run(lab.notebook.start_session(hf_max_batch_size=8, kv_cache_gib=1))
    gpu, gpu_set, cpu, _ = made
    assert (gpu.kv_cache_gib, gpu.hf_max_batch_size) == (lab.notebook.GPU_KV_GIB, lab.notebook.GPU_HF_BATCH)
    assert (gpu_set.kv_cache_gib, gpu_set.hf_max_batch_size) == (1, 8)
    assert cpu.hf_max_batch_size == EngineConfig().hf_max_batch_size and cpu.kv_cache_gib == EngineConfig().kv_cache_gib


class Checked(Exception):
    """A notebook's engine call whose plan passed every rule: the fake stops there (no engines)."""


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebooks_gpu_sizes_pass_the_rules_before_anything_loads(path, monkeypatch):
    """Every code cell run as on a GPU, with a session that loads nothing: each experiment, sweep and load test the
    notebook asks for is checked by the rules the real call applies first (lengths, users, max_model_len, block
    sizes), then stopped. A cell that needs an earlier call's result (or an engine's own figure) fails on the missing
    name and is passed over; anything else fails the test: a rule's refusal, as 02's 1,024-token answers did on an
    H200 (and its exercise's output_len=None, found here)."""
    import lab.capacity
    import lab.experiments
    import lab.notebook
    import lab.sweeps
    from lab.notebook import run_cell

    class GpuSession:  # made by the notebooks' own start_session, which sets its GPU sizes
        def __init__(self, config, engines):
            self.config = config.with_overrides(device="cuda")
            self.engines, self.agreement = dict.fromkeys(engines), None
            self.check = SimpleNamespace(device="cuda")
            self.info = {name: SimpleNamespace(kv_block_size=self.config.resolved_block_size()) for name in engines}

        async def start(self):
            pass

        async def run(self, plan):
            raise Checked

        async def stop(self):
            pass

    async def run_experiment(session, name, params, *_, **__):
        lab.experiments.validate(name, params, session.config)
        raise Checked

    async def run_sweep(session, plan, *_, **__):
        plan.configs(session.config)
        raise Checked

    async def run_capacity(session, plan, *_, **__):  # lab.capacity.capacity_plan checked it against the config
        raise Checked

    monkeypatch.setattr(lab.notebook, "on_gpu", lambda: True)
    monkeypatch.setattr(lab.notebook, "LabSession", GpuSession)
    monkeypatch.setattr(lab.experiments, "run_experiment", run_experiment)
    monkeypatch.setattr(lab.sweeps, "run_sweep", run_sweep)
    monkeypatch.setattr(lab.capacity, "run_capacity", run_capacity)
    loop, namespace, checked = asyncio.new_event_loop(), {}, 0
    try:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                try:
                    run_cell("".join(cell["source"]), namespace, loop, path.name)
                except Checked:
                    checked += 1
                except (NameError, AttributeError):  # a result (or an engine's figure) the fake never made
                    pass
    finally:
        loop.close()
    assert namespace.get("GPU", True) and checked, f"{path.name}: no engine call reached on the GPU path"


def test_a_knob_sets_each_top_level_assignment_of_its_name_and_one_no_cell_assigns_is_refused():
    """A test runs a notebook as a learner who edited its knobs would: every top-level ``NAME = ...`` of the knob's
    name takes its value (the comment after it kept, a nested one and other names left alone), in every notebook
    KNOBS edits; a knob that no cell assigns (a renamed one) fails instead of running the learner's size."""
    source = 'x = "→"; REPEATS = 3  # three\nTOP = (32 if GPU\n       else 5)  # busy\ndef f():\n    REPEATS = 9\n'
    assert set_knobs(source, {"REPEATS": 2, "TOP": 3}) == (
        'x = "→"; REPEATS = 2  # three\nTOP = (3)  # busy\ndef f():\n    REPEATS = 9\n', {"REPEATS", "TOP"})
    for path in NOTEBOOKS:
        knobs = KNOBS.get(path.stem, {})
        namespace = {}
        for cell in code_cells(path, knobs):
            for line in "".join(cell["source"]).splitlines():
                if line.split(" = ")[0] in knobs:
                    exec(line.split("#")[0], namespace)
        assert {name: namespace[name] for name in knobs} == knobs, path.name
    with pytest.raises(ValueError, match="01_hf_vs_vllm.ipynb: no cell assigns NO_SUCH_KNOB"):
        code_cells(NOTEBOOKS[0], {"NO_SUCH_KNOB": 2})
