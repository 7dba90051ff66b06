"""why: the HF-to-vLLM ratio taken apart, one mechanism per rung (lab.experiments.ladder), on the same seeded requests.

Each rung's engine is started once (the session's own engine where its settings match, else one the session
holds for its ladders: lab.session's ``rungs``), warmed up and measured as a load test warms up an engine and
measures a level (lab.runs), then the rungs take turns, ``repeats`` times over, on identical requests: a repeat's
rungs run minutes apart at most, so drift favours none. A preset chooses a load that holds the mechanism it is named
for:
- overhead: 1 user, short prompts: no batching or paging can act; what remains is what a step costs.
- spread: answers spread 12x (16x on a GPU), several requests per user: static batches wait for their longest
  answer while continuous batching refills a finished request's slot at the next step.
- memory: HF and vLLM get the same KV tokens; HF reserves each batch's longest request up front (a static
  cache of batch x (prompt + output)), so the budget caps its batch, while vLLM's blocks hold what requests use.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import statistics
import time
from dataclasses import dataclass, replace

from lab.config import MAX_REPEATS, LoadConfig, RunPlan, parse_users
from lab.engines import registry
from lab.experiments.ladder import METHOD, RUNGS, check_rungs, decompose, skip_reason
from lab.load.workloads import longest_request, make_requests
from lab.memory import capped_steps, card_share, model_kv_bytes_per_token, shared_block
from lab.metrics.kv import blocks_for
from lab.metrics.steps import level_factors
from lab.runs import SETTLE_S, LevelResult, RunResult, run_level, warm_up, warmup_requests
from lab.session import through_cancel
from lab.tasks import nothing

log = logging.getLogger(__name__)
ENGINES = (registry.BASELINE, registry.RATIO_TOP)  # what the session should hold; the other rungs start here


@dataclass(frozen=True)
class Load:
    """One preset's load on one device kind: users, requests per user, workload, output length, HF's batch cap
    under the memory preset (0: no shared budget)."""

    users: int
    requests_per_user: int
    workload: str
    output_len: int | None = None
    hf_cap: int = 0


PRESETS = {
    "overhead": {"cpu": Load(1, 3, "equal", 32), "cuda": Load(1, 4, "equal", 128)},
    "spread": {"cpu": Load(4, 4, "spread"), "cuda": Load(64, 4, "spread")},
    "memory": {"cpu": Load(8, 2, "spread", hf_cap=3), "cuda": Load(64, 2, "spread", hf_cap=16)},
}
PRESET_WORDS = {
    "overhead": "short prompts, answers of one length: at 1 user no batching or paging can act, so what differs is "
                "what one step costs",
    "spread": "answers of very different lengths, several per user: static batches wait for their longest answer, "
              "continuous batching refills a finished slot at the next step",
    "memory": "the same KV tokens for both: HF reserves each request's longest possible length up front (a static "
              "cache), vLLM's blocks hold what requests use",
}


LEVELS = {"cpu": "1,4", "cuda": "1,8,64"}  # the ladder at every load: the levels a device runs unless told


@dataclass(frozen=True)
class Params:
    """preset: overhead, spread or memory (what the load holds); repeats: turns of every rung (interleaved);
    rungs: the rungs to run, a comma list (hf and vllm at least); users: the user levels to run the preset's load
    at, a comma list (the whole ladder at each, smallest first), empty for the preset's own level."""

    preset: str = "overhead"
    repeats: int = 3
    rungs: str = ",".join(RUNGS)
    users: str = ""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if not isinstance(self.repeats, int) or not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"repeats must be a whole number from 1 to {MAX_REPEATS}, not {self.repeats}")
        check_rungs(self.rung_names())
        if self.users:
            LoadConfig(users=parse_users(self.users))  # the load test's limits and words

    def rung_names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.rungs.replace(" ", ",").split(",") if n.strip())

    def levels(self, config) -> tuple[int, ...]:
        """The user levels, smallest first."""
        return tuple(sorted(set(parse_users(self.users)))) if self.users else (self.load(config).users,)

    def load(self, config, users: int | None = None) -> Load:
        """The preset's load on this device, at ``users`` (the preset's own level when None)."""
        load = PRESETS[self.preset]["cuda" if config.resolved_device() == "cuda" else "cpu"]
        return load if users is None else replace(load, users=users)

    def widest(self, config) -> Load:
        """The load at the largest level (what the rungs' shared settings are sized for)."""
        return self.load(config, max(self.levels(config)))


def check(params: Params, config) -> None:
    """The preset's requests must fit max_model_len (the memory preset sets its own)."""
    load = params.widest(config)
    LoadConfig(users=(load.users,), workload=load.workload, requests_per_user=load.requests_per_user,
               output_len=load.output_len)
    prompt, output = longest_request(load.workload, load.output_len)
    if not load.hf_cap and prompt + output > config.max_model_len:
        raise ValueError(f"the {params.preset} preset's longest request ({prompt} + {output} tokens) is past "
                         f"max_model_len {config.max_model_len}: raise --max-model-len to {prompt + output}")


def budget(params: Params, config, per_token: int) -> dict:
    """The memory preset's shared KV budget (computed): HF's cap x its longest request, in tokens, and the
    settings that give vLLM and HF-CB those tokens; {} for the other presets."""
    load = params.load(config)
    if not load.hf_cap:
        return {}
    longest = sum(longest_request(load.workload, load.output_len))
    block = shared_block(config)
    tokens = load.hf_cap * longest
    blocks = tokens // block
    return {"tokens": blocks * block, "longest_request": longest, "hf_cap": load.hf_cap, "block_size": block,
            "bytes": blocks * block * per_token,
            "overrides": {"hf_max_batch_size": load.hf_cap, "block_size": block, "num_kv_blocks": blocks + 1,
                          "max_model_len": blocks_for(longest, block) * block,
                          "kv_cache_gib": blocks * block * per_token / 1024**3}}


def preset_config(params: Params, config, per_token: int):
    """The session's config with the preset's shared settings: the memory preset's budget (HF-CB in vLLM's block
    size), else an HF batch as wide as the load's users (a narrower cap would be a width limit, not batching)."""
    shared = budget(params, config, per_token).get("overrides")
    if shared:
        return config.with_overrides(**shared, hf_cb_page_size=shared["block_size"])
    return config.with_overrides(hf_max_batch_size=max(config.hf_max_batch_size, params.widest(config).users))


def engines(params: Params, config) -> tuple[str, ...]:
    """What the CLI's session loads for this ladder: ENGINES where it runs the preset's own settings (its hf and vllm
    are then rungs), else none (each rung starts its own: nothing loads twice)."""
    from lab.model import resolve_model

    per_token = model_kv_bytes_per_token(resolve_model(config.model), config.resolved_dtype())
    return ENGINES if preset_config(params, config, per_token) == config else ()


async def run(session, params: Params, result, notify) -> None:
    """At each user level, start (or reuse) the rungs and run them in turns, filling the factors after every turn;
    stop what was started here."""
    device = session.check.device
    per_token = model_kv_bytes_per_token(session.check.model_path, session.config.resolved_dtype())
    config = preset_config(params, session.config, per_token)
    shared = budget(params, session.config, per_token)
    result.fields["method"] = METHOD
    try:
        for users in params.levels(config):
            load = params.load(config, users)
            result.fields.update(_head(params, device, load, shared))
            await _level(session, params, config, device, result, notify, load)
        result.message = "done"
    finally:
        await session.release_rungs()  # unless the session keeps them for its next ladder (lab.session)


async def _level(session, params: Params, config, device: str, result, notify, load: Load) -> None:
    """The whole ladder at one level, kept in fields["levels"] when done."""
    requests = make_requests(session.tokenizer, load.workload, load.users * load.requests_per_user, 11,
                             load.output_len, prefix="why")
    rungs: dict = {}
    await _start_rungs(session, params, config, device, rungs, result, notify)
    for repeat in range(params.repeats):  # odd repeats run backwards: drift favours no rung
        turns = list(rungs.items()) if repeat % 2 == 0 else list(rungs.items())[::-1]
        for name, rung in turns:
            await _turn(name, rung, requests, repeat, params, result, notify, session)
    keep_level(result)


LEVEL_KEYS = ("load", "rungs", "factors", "sides", "total", "product", "steps")


def keep_level(result) -> None:
    """The level just measured, kept under fields["levels"] (its users as the key) and in the caption."""
    fields = result.fields
    fields.setdefault("levels", {})[str(fields["load"]["users"])] = {
        k: copy.deepcopy(fields.get(k)) for k in LEVEL_KEYS}
    fill(None, result)


def _head(params: Params, device: str, load: Load, shared: dict) -> dict:
    return {"preset": params.preset, "preset_words": PRESET_WORDS[params.preset], "device_kind": device,
            "load": {"users": load.users, "requests_per_user": load.requests_per_user, "workload": load.workload,
                     "output_len": load.output_len},
            "budget": {k: v for k, v in shared.items() if k != "overrides"} or None,
            "repeats": params.repeats, "rungs": {}, "factors": [], "sides": [], "total": None, "product": None,
            "steps": None}


async def _start_rungs(session, params, config, device, rungs, result, notify) -> None:
    """Each rung's engine: the session's where its settings match, else a new one (vLLM first)."""
    asked = check_rungs(params.rung_names())
    order = sorted(RUNGS, key=lambda n: not _pooled(n))
    for name in order:
        reason = skip_reason(name, device, asked)
        entry = result.fields["rungs"][name] = {"label": RUNGS[name].label, "engine": RUNGS[name].engine,
                                                "flags": RUNGS[name].flags,
                                                "status": "skipped" if reason else "starting", "reason": reason or "",
                                                "tok_s": [], "tpot_ms": [], "peak_running": [], "turns": []}
        if reason:
            continue
        rung_config = config.with_overrides(**dict(RUNGS[name].overrides))
        rung_config = _as_wide_as_the_load(name, rung_config, params.load(config, result.fields["load"]["users"]))
        rung_config = _beside_the_others(name, rung_config, session.check.model_path)
        result.message = f"starting rung {name} ({RUNGS[name].label})"
        notify(result)
        began = time.perf_counter()
        engine = await _engine(session, name, rung_config, entry)
        if engine is None:
            continue
        entry["args"] = engine.args if RUNGS[name].whole_batch else engine.info.args
        entry["start_s"] = round(time.perf_counter() - began, 2)
        plan = _plan(name, rung_config, result.fields["load"])
        await _warm(name, engine, plan, session.tokenizer, entry)
        if entry["status"] == "starting":
            rungs[name] = engine, plan
            entry["status"] = "ran"
    result.fields["rungs"] = {n: result.fields["rungs"][n] for n in RUNGS}  # ladder order, whatever the start order


def _pooled(name: str) -> bool:
    """Its engine holds a vLLM pool (its own or its family's registry entry says): started first, given its share of
    the card, on a CPU settled after each turn."""
    rung = RUNGS[name]
    return registry.spec(rung.family or rung.engine).kv_pool


def _as_wide_as_the_load(name: str, config, load: Load):
    """A rung that fits the load (hf-compiled): one compiled batch shape no wider than the load, its static cache as
    long as the load's longest request (attention over unused slots would be a cost of the cache's size, not of
    compiling); a whole-batch rung (offline): at most ``users`` requests in a step, as the closed-loop rungs have
    (vLLM refills a finished one's place from its queue)."""
    if RUNGS[name].fits_load:
        longest = -(-sum(longest_request(load.workload, load.output_len)) // 16) * 16
        return config.with_overrides(hf_max_batch_size=min(config.hf_max_batch_size, load.users),
                                     max_model_len=min(config.max_model_len, longest))
    return capped_steps(config, load.users) if RUNGS[name].whole_batch else config


def _beside_the_others(name: str, config, model_path: str):
    """A vLLM rung asks for its share of the card (lab.memory.card_share): the ladder holds several engines at once."""
    return card_share(config, model_path) if _pooled(name) else config


async def _engine(session, name: str, config, entry: dict):
    """The rung's engine (lab.session's rung: the session's, one it keeps, or a new one started); None (the rung
    skipped with the error it raised) where an optional rung's engine fails to start here."""
    try:
        return await session.rung(name, config)
    except Exception as exc:
        if not RUNGS[name].optional:
            raise
        log.exception("rung %s did not start", name)
        entry["status"], entry["reason"] = "skipped", f"its engine failed to start here: {type(exc).__name__}: {exc}"
        return None


def _plan(name: str, config, load: dict) -> RunPlan:
    """A rung's turns as a run's level (lab.runs): its engine, the ladder's load, and as warm-up max(2, users) short
    unmeasured requests (a rung whose engine is not registered is labelled by its family: offline by its vLLM)."""
    engine = RUNGS[name].family or RUNGS[name].engine
    return RunPlan(engines=(engine,), engine=config,
                   load=LoadConfig(users=(load["users"],), workload=load["workload"], output_len=load["output_len"],
                                   requests_per_user=load["requests_per_user"], warmup_requests=max(2, load["users"])))


async def _warm(name, engine, plan: RunPlan, tokenizer, entry) -> None:
    """The run's warm-up (lab.runs.warm_up; a whole-batch rung's in one call); a warm-up past the rung's bound (for
    hf-compiled, its compiles) drops it."""
    began = time.perf_counter()
    if RUNGS[name].whole_batch:
        await engine.generate(warmup_requests(tokenizer, plan, name))
    else:
        await warm_up(engine, tokenizer, plan)
    entry["warmup_s"] = round(time.perf_counter() - began, 2)
    bound, what = RUNGS[name].warmup_bound or (None, "")
    if bound is not None and entry["warmup_s"] > bound:
        entry["status"], entry["reason"] = "skipped", (
            f"{what} took {entry['warmup_s']:.0f} s, past the bound of {bound:.0f} s")


async def _turn(name, rung, requests, repeat, params, result, notify, session) -> None:
    """One rung's turn: the requests through its users (a whole-batch rung: all at once), its figures, the new
    factors."""
    engine, plan = rung
    users, entry = plan.load.users[0], result.fields["rungs"][name]
    result.message = f"repeat {repeat + 1} of {params.repeats}: {name} ({entry['label']})"
    notify(result)
    if RUNGS[name].whole_batch:  # its loop cannot be interrupted: a cancel waits for it, then stops the ladder
        (tokens, seconds), cancelled = await through_cancel(engine.generate(requests))
        if cancelled:
            raise asyncio.CancelledError
        tok_s, tpot, peak = tokens / seconds, None, None  # the offline loop samples no running count
    else:
        level = await _measure(session, engine, plan, requests, repeat)
        summary = level.summary
        if summary.completed < len(requests):
            raise RuntimeError(f"rung {name} finished {summary.completed} of {len(requests)} requests"
                               f" ({summary.errors} errors, {summary.cancelled} cancelled)")
        tok_s, tpot = summary.output_tok_s, summary.tpot_s.p50
        peak = max((s.running for s in level.samples), default=None)
        entry["turns"].append({"repeat": repeat, "output_tokens": summary.output_tokens,
                               "duration_s": summary.duration_s, "steps": level.steps})
    entry["tok_s"].append(round(tok_s, 3))
    entry["tpot_ms"].append(None if tpot is None else round(tpot * 1000, 2))
    entry["peak_running"].append(peak)
    result.rows.append({"rung": name, "users": users, "repeat": repeat, "output_tok_s": round(tok_s, 3),
                        "tpot_p50_ms": entry["tpot_ms"][-1], "peak_running": peak})
    fill(None, result)
    notify(result)
    if _pooled(name) and session.check.device == "cpu":
        await asyncio.sleep(SETTLE_S)


async def _measure(session, engine, plan: RunPlan, requests: list, repeat: int) -> LevelResult:
    """One turn measured as a run measures a level (lab.runs.run_level), on the ladder's requests."""
    turn = RunResult(plan=plan, model_path=session.check.model_path, engine_info={engine.name: engine.info})
    return await run_level(plan, engine, session.tokenizer, plan.load.users[0], turn, nothing, repeat, requests)


def fill(session, result) -> None:
    """The factors and the caption from the turns measured so far (also after a cancel or a failure)."""
    from lab.experiments.why_words import why_caption

    fields = result.fields
    ran = {n: r["tok_s"] for n, r in fields.get("rungs", {}).items() if r["tok_s"]}
    whole = min(map(len, ran.values()), default=0)  # the repeats every rung finished: a cut one is left out
    tok_s = {n: v[:whole] for n, v in ran.items()}
    fields.update(decompose(tok_s, fields.get("device_kind", "cpu")))
    for entry in fields.get("rungs", {}).values():
        done = [v for v in entry["tpot_ms"] if v is not None]
        entry["tpot_ms_median"] = round(statistics.median(done), 2) if done else None
    result.series = {"tok_s": tok_s}
    fields["steps"] = rung_steps(fields)
    fields["caption"] = levels_caption(fields, why_caption(fields))


def levels_caption(fields: dict, level_caption: str) -> str:
    """A ladder of several levels: what moved across them, then the level now running or last run in detail."""
    from lab.experiments.why_words import ladder_levels_lines
    from lab.words import users_words

    lines = ladder_levels_lines(fields.get("levels", {}))
    if not lines:
        return level_caption
    return "\n".join(f"- {line}" for line in lines) + f"\n\nAt {users_words(fields['load']['users'])}:\n" + \
        level_caption


def rung_steps(fields: dict) -> dict | None:
    """hf -> vllm at this level taken apart as a load test's level is (lab.metrics.steps): tokens per step x time
    per step x busy fraction, from the turns both rungs finished; None where either timed no step."""
    rungs, users = fields.get("rungs", {}), fields.get("load", {}).get("users")
    runs = [{"engine": name, "users": users, **turn} for name in ENGINES
            for turn in rungs.get(name, {}).get("turns", [])]
    return level_factors(runs, users, *ENGINES) if runs else None
