"""lab.app.mirror: the page's copy of a run, kept by parts, equals the run it mirrors at every step."""

import pickle

from bench.redraw_cost import made_up_run
from lab.app.mirror import SAME, apply_part, apply_run, held_thing, holding, part_of, run_part
from lab.status import RunStatus
from lab.sweeps import SweepResult


def running_run():
    """Two finished levels and a third running, half of its requests still in flight."""
    run = made_up_run([1, 2, 4], 3, 16, 1)
    last = run.levels[-1]
    ended = sorted(last.records, key=lambda r: r.end_s)
    last.records = ended[: len(ended) // 2]
    for record in ended[len(ended) // 2:]:
        record.end_s = None
    return run, ended[len(ended) // 2:]


def synced(mirror, run):
    """One sync as the page's process makes it: the host cuts a part, it crosses as bytes, the mirror applies it."""
    return apply_run(mirror, pickle.loads(pickle.dumps(run_part(run, holding(mirror)))))


def assert_same(mirror, run):
    info = run.engine_info["vllm"]
    assert (mirror.id, mirror.status, mirror.message) == (run.id, run.status, run.message)
    for mine, theirs in zip(mirror.levels, run.levels, strict=True):
        assert [r.request_id for r in mine.records] == [r.request_id for r in theirs.records]
        assert len(mine.samples) == len(theirs.samples) and mine.status == theirs.status
        assert sorted(r.request_id for r in mine.sent) == sorted(r.request_id for r in theirs.sent)
        assert mine.kv_held(info) == theirs.kv_held(info) and mine.throughput() == theirs.throughput()


def test_a_mirror_follows_a_running_level_to_its_end():
    run, in_flight = running_run()
    mirror = synced(None, run)
    assert_same(mirror, run)
    assert {r.request_id for r in mirror.levels[-1].in_flight()} == {r.request_id for r in in_flight}
    last = run.levels[-1]
    for record in in_flight:  # they end, the level ends
        record.end_s = record.token_times_s[-1]
        last.records.append(record)
    last.finish(run.engine_info["vllm"], RunStatus.OK)
    mirror = synced(mirror, run)
    assert_same(mirror, run)
    assert mirror.levels[-1].summary == last.summary and mirror.levels[-1].in_flight() == []


def test_a_part_carries_only_what_the_mirror_lacks():
    run, _ = running_run()
    mirror = synced(None, run)
    part = run_part(run, holding(mirror))
    assert part.levels[:2] == [None, None]  # seen ending: never sent again
    running = part.levels[2]
    assert running.records == [] and running.samples == [] and len(running.sent) == len(run.levels[2].in_flight())
    assert len(pickle.dumps(part)) < len(pickle.dumps(run_part(run, None))) / 4


def test_a_new_run_replaces_the_mirror():
    first, _ = running_run()
    mirror = synced(None, first)
    second, _ = running_run()
    assert second.id != first.id
    mirror = synced(mirror, second)
    assert_same(mirror, second)


def test_a_sweep_is_mirrored_with_its_live_run_and_once_ended_crosses_no_more():
    run, _ = running_run()
    sweep = SweepResult(plan=None, model="m", points=[{"value": 32, "restart_s": 4.0}], run=run)
    mirror = apply_part(None, part_of(sweep, None))
    assert mirror.points == sweep.points and mirror.run is not sweep.run
    assert_same(mirror.run, run)
    sweep.points.append({"value": 64, "restart_s": 5.0})
    again = apply_part(mirror, pickle.loads(pickle.dumps(part_of(sweep, held_thing(mirror, False)))))
    assert again.run is mirror.run and again.points == sweep.points  # the run kept, the rest replaced
    sweep.status = RunStatus.OK  # as a sweep reads before its restore: its task still runs
    ended = apply_part(again, part_of(sweep, held_thing(again, False)))
    sweep.message = "done; vllm restored with the session's setting"
    assert part_of(sweep, held_thing(ended, False)).message == sweep.message  # not SAME: cut while it ran
    assert part_of(sweep, held_thing(ended, True)) == SAME  # cut once nothing ran: final
    assert apply_part(ended, SAME) is ended and apply_part(ended, None) is None


def test_a_mirrors_live_kv_rows_settle_by_when_they_were_copied():
    """A row is kept once the next sample is FINAL_AFTER_S old: in a mirror, old at the copy, not at the redraw
    (the copy may lag the host by a sync, and a row kept early would miss its step's tokens)."""
    run, _ = running_run()
    last = run.levels[-1]
    mirror = synced(None, run)
    level = mirror.levels[-1]
    assert level.copied_s is not None and last.copied_s is None
    level.copied_s = min(s.time_s for s in level.samples)  # as if copied before any of its steps settled
    level.kv_held(run.engine_info["vllm"])
    assert level._live[1] == 0  # nothing kept
    later = synced(None, run).levels[-1]
    later.copied_s = max(s.time_s for s in later.samples) + 1  # copied once they all had settled
    later.kv_held(run.engine_info["vllm"])
    assert later._live[1] == len(later.samples) - 1  # all kept but the last (its row may still change)
