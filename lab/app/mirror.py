"""A copy of the engine host's live results in another process, kept up to date by what is new.

The dashboard must not draw in the interpreter that drives the engines (its redraws take time from vLLM's async
front end), so the engine host runs in a process of its own (lab.app.host_process) and the page
reads a mirror. The mirror says what it holds (``holding``: which run, and per level how many records and
samples and whether it saw the level end); the host answers with a part (``run_part``): each level cut to
what the mirror lacks, the requests still in flight whole (one per user at most), a level the mirror saw
end left out (None), stamped with when it was copied. Ended records and samples never change, so each
crosses once. Experiments, sweeps and capacity searches carry a run of their own (``part_of`` / ``apply_part``);
one whose end the mirror holds crosses no more (SAME). Status fields are applied last, so that a reader who sees a
level or run ended sees all of it. Pure functions: no I/O, no locks.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace

from lab.runs import LevelResult, RunResult
from lab.status import RunStatus

ENDED_FIELDS = ("error", "summary", "kv", "kv_series", "tok_s_series", "steps", "machine", "status")  # status last
SAME = "same"  # part_of's answer for an experiment or sweep the mirror already holds, ended
RUN_LEVELS = "levels"  # a task's own list of its run's levels (a capacity search's probes, each one's requests):
#                        it crosses as the run does, cut, not whole at every sync; the mirror's are its run's


def holding(run: RunResult | None) -> tuple | None:
    """What a mirrored run holds: (run_id, ((records, samples, ended) per level))."""
    if run is None:
        return None
    return run.id, tuple((len(lvl.records), len(lvl.samples), lvl.status != RunStatus.RUNNING) for lvl in run.levels)


def run_part(run: RunResult | None, held: tuple | None) -> RunResult | None:
    """``run`` as a mirror holding ``held`` lacks it (call where nothing changes it: the host's loop)."""
    if run is None:
        return None
    counts = held[1] if held is not None and held[0] == run.id else ()
    part, now_s = copy.copy(run), time.perf_counter()
    part.levels = [_level_part(lvl, counts[i] if i < len(counts) else (0, 0, False), now_s)
                   for i, lvl in enumerate(run.levels)]
    return part


def _level_part(level: LevelResult, held: tuple, now_s: float) -> LevelResult | None:
    records, samples, ended = held
    if ended:
        return None
    done = {id(r) for r in level.records}
    return replace(level, records=level.records[records:], samples=level.samples[samples:],
                   sent=[r for r in level.sent if id(r) not in done], _live=([], 0), copied_s=now_s)


def apply_run(mirror: RunResult | None, part: RunResult | None) -> RunResult | None:
    """The mirror with ``part`` added (a new mirror when the run changed)."""
    if part is None:
        return None
    if mirror is None or mirror.id != part.id:
        mirror = copy.copy(part)
        mirror.levels = []
    for index, level in enumerate(part.levels):
        if level is None:
            continue
        if index == len(mirror.levels):
            mirror.levels.append(replace(level, records=[], samples=[], sent=[], status=RunStatus.RUNNING))
        _extend(mirror.levels[index], level)
    fields = vars(part)
    vars(mirror).update({k: v for k, v in fields.items() if k not in ("levels", "status")})
    mirror.status = part.status
    return mirror


def _extend(level: LevelResult, part: LevelResult) -> None:
    level.records.extend(part.records)
    level.samples.extend(part.samples)
    level.sent, level.copied_s = level.records + part.sent, part.copied_s
    for name in ENDED_FIELDS:
        setattr(level, name, getattr(part, name))


def held_thing(thing, settled: bool) -> tuple | None:
    """What a mirrored experiment or sweep holds: (its id, whether it holds its end, its run's holding).
    ``settled``: the copy was cut when no task ran on the host (a sweep's status reads ok before its restore
    and last words, so an ended status alone does not say the copy is final)."""
    if thing is None:
        return None
    return thing.id, settled and thing.status != RunStatus.RUNNING, holding(thing.run)


def part_of(thing, held: tuple | None):
    """An experiment or sweep with its live run cut as ``run_part`` cuts one; SAME when the mirror holding
    ``held`` holds its end."""
    if thing is None:
        return None
    same = held is not None and held[0] == thing.id
    if same and held[1] and thing.status != RunStatus.RUNNING:
        return SAME
    part = copy.copy(thing)
    part.run = run_part(thing.run, held[2] if same else None)
    if hasattr(thing, RUN_LEVELS):
        setattr(part, RUN_LEVELS, None)
    return part


def apply_part(mirror, part):
    """The mirrored experiment or sweep with ``part`` added."""
    if part is None or isinstance(part, str):  # no experiment (sweep), or SAME
        return None if part is None else mirror
    same = mirror is not None and mirror.id == part.id
    run = apply_run(mirror.run if same else None, part.run)
    mirror = copy.copy(part)
    mirror.run = run
    if hasattr(part, RUN_LEVELS):
        setattr(mirror, RUN_LEVELS, [] if run is None else run.levels)
    return mirror


def hold(thing, settled: bool) -> tuple | None:
    """What a mirrored task of any kind holds (a run: ``holding``; else ``held_thing``)."""
    return holding(thing) if isinstance(thing, RunResult) else held_thing(thing, settled)


def cut(thing, held: tuple | None):
    """The part of a task of any kind that a mirror holding ``held`` lacks."""
    return run_part(thing, held) if isinstance(thing, RunResult) else part_of(thing, held)


def apply(mirror, part):
    """The mirrored task of any kind with ``part`` added."""
    return apply_run(mirror, part) if isinstance(part, RunResult) else apply_part(mirror, part)
