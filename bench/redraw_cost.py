"""What one redraw of the live Load-test plots costs the interpreter, on a GPU-sized run made up here.

The dashboard redraws its four plots over time once a second while a run goes, in the page's process (the
engines run in a process of their own, lab.app.host_process); this says what such a tick costs that process. It
builds a RunResult shaped like an H100 run of the 135M shape (a sample per engine step of ~3 ms, a
token per request per step) with the last level still running, then times what a tick does: the
figures (lab.app.dashboard.over_time_view) and their JSON, as the page gets it. The first tick computes the
running level's KV rows; later ticks get no new samples here, so they reuse the rows that have settled and
stand for a tick of a live run only as a lower bound: both are printed.
Usage: python -m bench.redraw_cost [--users 20,64] [--requests-per-user 8] [--output-len 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from lab.app.dashboard import over_time_view, parts
from lab.config import EngineConfig, LoadConfig, RunPlan
from lab.engines.base import EngineInfo, EngineSample
from lab.load.driver import RequestRecord
from lab.runs import LevelResult, RunResult
from lab.status import RunStatus

STEP_S = 0.003  # an H100 step of the 135M shape at 20-64 users
BLOCKS, BLOCK = 100_000, 16


def made_up_level(users: int, per_user: int, output_len: int, origin: float, repeat: int) -> LevelResult:
    """A closed-loop level: each user's requests back to back, a token per step, a sample per step."""
    level = LevelResult(engine="vllm", users=users, planned=users * per_user, repeat=repeat)
    for user in range(users):
        send = origin + user * STEP_S / users
        for k in range(per_user):
            times = [send + STEP_S * (i + 1) for i in range(output_len)]
            record = RequestRecord(engine="vllm", users=users, user_id=user, request_id=f"{user}-{k}", send_s=send,
                                   prompt_tokens=256, max_tokens=output_len, first_token_s=times[0],
                                   end_s=times[-1], token_times_s=times)
            level.records.append(record)
            level.sent.append(record)
            send = times[-1] + STEP_S
    end = max(r.end_s for r in level.records)
    steps = int((end - origin) / STEP_S) + 1
    level.samples = [EngineSample(engine="vllm", time_s=origin + i * STEP_S, running=users, waiting=0,
                                  kv_usage=users * 24 / BLOCKS, kv_total_blocks=BLOCKS, kv_block_size=BLOCK)
                     for i in range(steps)]
    return level


def made_up_run(users: list[int], per_user: int, output_len: int, repeats: int) -> RunResult:
    """Every level finished but the last, which is still running (as the page sees it at the run's end)."""
    load = LoadConfig(users=tuple(users), requests_per_user=per_user, output_len=output_len, repeats=repeats)
    result = RunResult(plan=RunPlan(engines=("vllm",), load=load, engine=EngineConfig(device="cpu")), model="m",
                       model_path="m", device={}, versions={})
    info = EngineInfo(name="vllm", kv_bytes_per_token=18_432, kv_total_blocks=BLOCKS, kv_block_size=BLOCK)
    result.engine_info = {"vllm": info}
    origin = result.origin_s
    for level_users in users:
        for repeat in range(repeats):
            level = made_up_level(level_users, per_user, output_len, origin, repeat)
            result.levels.append(level)
            origin = max(r.end_s for r in level.records) + 1.0
            level.finish(info, "ok")
    last = result.levels[-1]
    last.status, last.summary, last.kv_series, last.tok_s_series = RunStatus.RUNNING, None, None, None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="20,64")
    parser.add_argument("--requests-per-user", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    result = made_up_run([int(u) for u in args.users.split(",")], args.requests_per_user, args.output_len,
                         args.repeats)
    tokens = sum(len(r.token_times_s) for lvl in result.levels for r in lvl.records)
    samples = sum(len(lvl.samples) for lvl in result.levels)
    figures, json_s = [], []
    for _ in range(args.ticks):
        began = time.perf_counter()
        view = over_time_view(result)
        figures.append(time.perf_counter() - began)
        began = time.perf_counter()
        for fig in parts(view)[1:]:
            fig.to_json()
        json_s.append(time.perf_counter() - began)
    print(f"{len(result.levels)} levels, {tokens:,} tokens, {samples:,} engine samples; one redraw: first "
          f"tick {figures[0] * 1e3:.0f} ms, later (best / median of {args.ticks - 1}): figures "
          f"{_ms(figures[1:] or figures)}, their JSON {_ms(json_s)}")


def _ms(seconds: list[float]) -> str:
    return f"{min(seconds) * 1e3:.0f} / {sorted(seconds)[len(seconds) // 2] * 1e3:.0f} ms"


if __name__ == "__main__":
    main()
