"""What one probe measured: its targets' percentiles (a failed request a miss above every limit) and Little's law
over the probe's steady window (lab.capacity's docstring says how the window and its edge bound are found)."""

from __future__ import annotations

import math
import statistics

from lab.capacity.targets import AGREE, STEADY_EDGE, Target, seconds_words
from lab.metrics import e2e_from_schedule_s, itls_s, percentile, tpot_s, ttft_from_schedule_s
from lab.status import RequestStatus

SAMPLES = {"ttft": ttft_from_schedule_s, "tpot": tpot_s, "e2e": e2e_from_schedule_s}  # itl: pooled gaps


def samples(records, metric: str) -> tuple[list[float], int]:
    """A metric's values over the completed requests (TTFT and E2E from the scheduled send in open loop) and the
    number of requests that did not complete (misses)."""
    done = [r for r in records if r.status == RequestStatus.OK]
    misses = len(records) - len(done)
    if metric == "itl":
        return [gap for r in done for gap in itls_s(r)], misses
    return [v for r in done if (v := SAMPLES[metric](r)) is not None], misses


def percentile_with_misses(values: list[float], misses: int, q: float) -> float | None:
    """The q-th percentile (linear between ranks, as lab.metrics) of ``values`` plus ``misses`` samples above
    every limit; None when there is no sample or the rank falls among the misses."""
    ordered = sorted(values)
    total = len(ordered) + misses
    position = (total - 1) * q / 100.0
    if not total or math.ceil(position) >= len(ordered):
        return None
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def target_values(records, targets: tuple[Target, ...]) -> dict[str, float | None]:
    """Each target's percentile, measured over one run's requests (failed ones count as misses)."""
    return {t.name: percentile_with_misses(*samples(records, t.metric), t.percentile) for t in targets}


def latency_percentiles(records, metric: str) -> dict:
    """p50, p95 and p99 of a metric over the completed requests (measured)."""
    values = samples(records, metric)[0]
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


def arrival_s(record) -> float:
    """When a request entered the system: its scheduled time in open loop, else its send."""
    return record.scheduled_s if record.scheduled_s is not None else record.send_s


def littles_law(records, users: int | None = None, rate: float | None = None, margin: float = AGREE,
                edge: float = STEADY_EDGE) -> dict:
    """Little's law (L = throughput x W) over one run's steady window (``steady_window``).

    Measured over the window: L, the time-average number of requests in the system (their time inside it over its
    length); the throughput (requests that left in it, completed or failed, over its length); W, their mean time in
    system (from the scheduled send in open loop); open loop, the arrival rate (arrivals in it over its length).
    Computed: L = throughput x W, and the agreement, computed / measured L (``agreed``: within ``margin`` of 1).

    The two differ only by the requests the window's edges cut: closed loop (think time 0: every user always has a
    request in the system, so L is the users), at most one per user at each edge, the user that opens the window
    and the one that closes it none, each by at most its time in system: the agreement is off by at most
    (1 - 1/users) x W_max / window, W_max the longest time in system of a request the window holds or cuts. Open
    loop, nothing is cut at the start (the first arrival); a stationary system has about L in flight at the end,
    so the bound is W_max / window. *Steady* (judged): that bound at most ``edge``; a rule on the window and the
    requests' lengths, never on the agreement. Recorded closed-loop levels (docs/capacity.md) reach 0.99 of the
    bound, so a looser rule would judge probes whose edges alone make them disagree. ``why``: why not steady.
    """
    ended = [r for r in records if r.end_s is not None]
    found = {"users": users, "rate": rate, "edge_limit": edge}
    window = steady_window(ended, users)
    if window is None:
        return found | {"steady": False, "agreed": None, "agreement": None, "why": no_window_words(ended, users)}
    start, end = window
    left = [r for r in ended if start < r.end_s <= end]
    if not left:
        return found | {"steady": False, "agreed": None, "agreement": None, "window_s": end - start,
                        "why": "no request left the system in its window"}
    figures = window_figures(ended, left, start, end, users)
    return figures | found | edge_verdict(figures, users, edge) | {"agreed": abs(figures["agreement"] - 1) <= margin}


def steady_window(records, users: int | None) -> tuple[float, float] | None:
    """Closed loop (``users``): from the last user's first send (every user has a request in the system) to the
    earliest last end of a user (the first user with nothing left); open loop, the span of the arrivals (the
    schedule running). None where it is empty (a user sent nothing, or it ends before it begins)."""
    if not records:
        return None
    if users is None:
        start, end = min(arrival_s(r) for r in records), max(arrival_s(r) for r in records)
    else:
        by_user = group_by_user(records)
        if len(by_user) < users:
            return None
        start = max(min(r.send_s for r in mine) for mine in by_user.values())
        end = min(max(r.end_s for r in mine) for mine in by_user.values())
    return (start, end) if end > start else None


def group_by_user(records) -> dict[int, list]:
    """The records of each closed-loop user (RequestRecord.user_id: the driver's user that sent it)."""
    by_user: dict[int, list] = {}
    for r in records:
        by_user.setdefault(r.user_id, []).append(r)
    return by_user


def no_window_words(records, users: int | None) -> str:
    """Why a run has no steady window."""
    if users is None:
        return f"its {len(records)} arrival{'' if len(records) == 1 else 's'} span no time"
    if len(group_by_user(records)) < users:
        return f"{len(group_by_user(records))} of its {users} users sent a request"
    return "its last user's first send came after its first user's last end"


def window_figures(ended, left, start: float, end: float, users: int | None) -> dict:
    """Little's law's figures over [start, end]: measured (L, throughput, W, W_max; open loop the arrival rate),
    and the computed L with its agreement."""
    length = end - start
    cut = [r for r in ended if arrival_s(r) < end and r.end_s > start]
    inside = sum(min(r.end_s, end) - max(arrival_s(r), start) for r in cut)
    mean_time = statistics.fmean(r.end_s - arrival_s(r) for r in left)
    measured, throughput = inside / length, len(left) / length
    figures = {"window_s": length, "departures": len(left), "mean_in_system": measured,
               "throughput_req_s": throughput, "mean_time_in_system_s": mean_time,
               "longest_in_system_s": max(r.end_s - arrival_s(r) for r in cut),
               "computed_in_system": throughput * mean_time, "agreement": throughput * mean_time / measured}
    if users is None:
        figures["arrival_rate_req_s"] = sum(1 for r in ended if start <= arrival_s(r) < end) / length
    return figures


def edge_bound(figures: dict, users: int | None) -> float:
    """The most the window's edges can move the agreement (computed): (1 - 1/users) x W_max / window closed loop,
    W_max / window open loop."""
    share = 1.0 if users is None else 1 - 1 / users
    return share * figures["longest_in_system_s"] / figures["window_s"]


def edge_verdict(figures: dict, users: int | None, edge: float) -> dict:
    """Steady when the edges can move the agreement by at most ``edge``; else why not, in numbers."""
    bound = edge_bound(figures, users)
    spans = figures["window_s"] / figures["longest_in_system_s"]
    why = "" if bound <= edge else (f"its window, {seconds_words(figures['window_s'])}, spans {spans:.2g}x its "
                                    f"longest request, so its edges could move the agreement by {percent_words(bound)}")
    return {"edge_bound": bound, "steady": bound <= edge, "why": why}


def percent_words(share: float) -> str:
    """0.104 -> '10.4%' (three figures: a bound just past 10% does not read as 10%)."""
    return f"{100 * share:.3g}%"
