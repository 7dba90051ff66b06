"""The sentences of a capacity result, computed from capacity.json's dict (every branch on its numbers): the headline,
what broke each engine's target first, Little's law, the repeats, early stops; and the progress line of a probe."""

from __future__ import annotations

from lab.capacity.little import percent_words
from lab.capacity.targets import AGREE, NEAR, RUNNING, STEADY_EDGE, WAITING, seconds_words
from lab.engines import registry
from lab.words.labels import kind


def level_words(value: float, unit: str) -> str:
    """'3 users', '1 user', '1.25 req/s'."""
    if unit == "users":
        return f"{value:g} user" + ("" if value == 1 else "s")
    return f"{value:.3g} req/s"


def times_words(ratio: float) -> str:
    """'16x', '1.5x'."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def capacity_answer(data: dict) -> list[str]:
    """The computed sentences of a capacity result: the headline, what broke each engine's target first, Little's
    law, the repeats, early stops."""
    lines = [headline(data), *limit_lines(data), little_line(data), repeat_line(data), *stop_lines(data)]
    return [line for line in lines if line]


def capacity_caption(data: dict) -> str:
    """The sentences as the page shows them under its figure (one paragraph each), computed again from the data:
    a capacity.json written before a sentence existed gets it too."""
    return "\n\n".join(capacity_answer(data))


def headline(data: dict) -> str:
    """'Under ttft_p95 <= 2 s and tpot_p95 <= 150 ms, HF served 3 users and vLLM 48 users: 16x the capacity
    (computed).', branching on each engine's bound."""
    targets = " and ".join(f"{t['name']} <= {seconds_words(t['limit_s'])}" for t in data["targets"])
    served = [served_words(name, data["capacity"][name]) for name in data["engines"]]
    ratios = [ratio_words(key, found, data) for key, found in data.get("ratios", {}).items()]
    tail = "; ".join(r for r in ratios if r)
    return f"Under {targets}, {join_words(served)}" + (f": {tail}." if tail else ".")


def join_words(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def served_words(name: str, found: dict) -> str:
    """What one engine served, said by its bound (while the search goes: so far)."""
    label, unit, verb = registry.label(name), found["unit"], "served" if found["unit"] == "users" else "sustained"
    value = level_words(found["value"], unit)
    if found["ended"] in (RUNNING, WAITING):
        return so_far_words(label, verb, found)
    if found["bound"] == "exact":
        return f"{label} {verb} {value} ({level_words(found['failed_at'], unit)} missed it)"
    if found["bound"] == "none":
        return f"{label} {verb} none (it missed the target at {level_words(found['least'], unit)})"
    if found["bound"] == "unknown":
        return unknown_words(label, found)
    if found["ended"] == "done":
        return f"{label} {verb} at least {value} (the most probed: every level met the target)"
    cap = f", fewer than {level_words(found['failed_at'], unit)}" if found["failed_at"] is not None else ""
    return f"{label} {verb} at least {value}{cap} (its search stopped early: {found['ended']})"


def unknown_words(label: str, found: dict) -> str:
    """An engine whose search ended with no level that met the target and none that missed it: not measured."""
    if found["ended"] == "not run":
        return f"{label} was not probed (the run ended before its turn)"
    if not found.get("levels"):
        return f"{label} was not measured (its search ended, {found['ended']}, before its first probe finished)"
    lowest = level_words(min(level["level"] for level in found["levels"]), found["unit"])
    return (f"{label} missed the target at every level probed, down to {lowest}, and its search ended "
            f"({found['ended']}) before one met it: below {lowest}, if any")


def so_far_words(label: str, verb: str, found: dict) -> str:
    """An engine whose search goes on (or has not begun): what its levels show so far."""
    if found["ended"] == WAITING:
        return f"{label} waits its turn"
    missed = f"; {level_words(found['failed_at'], found['unit'])} missed it" if found["failed_at"] is not None else ""
    if found["value"]:
        return f"{label} {verb} {level_words(found['value'], found['unit'])} so far (its search goes on{missed})"
    return f"{label}'s search goes on (no level met the target yet{missed})"


def ratio_words(key: str, found: dict, data: dict) -> str:
    """One capacity ratio, said by its bound ('' where it says nothing)."""
    top, base = key.split("/", 1)
    caps = data["capacity"]
    if found["value"] is None:
        return _none_words(registry.label(top), registry.label(base), caps[top], caps[base])
    value, bound = found["value"], found["bound"]
    if bound == "exact":
        return "the same capacity" if value == 1 else f"{times_words(value)} the capacity (computed)"
    if bound in ("at_least", "at_most"):
        return f"{bound.replace('_', ' ')} {times_words(value)} the capacity (computed from a bound)"
    return ""


def _none_words(top: str, base: str, top_cap: dict, base_cap: dict) -> str:
    if top_cap["value"] and base_cap["bound"] == "none":
        return f"{top} met the target where {base} met it at no level"
    if base_cap["value"] and top_cap["bound"] == "none":
        return f"{base} met the target where {top} met it at no level"
    return "neither met it" if top_cap["bound"] == base_cap["bound"] == "none" else ""


def little_line(data: dict) -> str:
    """Little's law over the probes: how many were steady (judged), how many of those agreed within AGREE, why any
    steady one disagreed and why the others were not steady (computed from each probe's ``little``)."""
    probes = [p for p in data["probes"] if p.get("little")]
    if not probes:
        return ""
    if any("edge_limit" not in p["little"] for p in probes):
        return old_little_line(data)
    steady = [p for p in probes if p["little"]["steady"]]
    agreed = [p for p in steady if p["little"]["agreed"]]
    parts = [f"Little's law (L = throughput x mean time in system, computed, against the measured time-average "
             f"number in the system, over each probe's steady window): {len(steady)} of {len(probes)} probes were "
             f"steady (their windows' edges could move the agreement by at most {STEADY_EDGE:.0%})",
             agreed_words(agreed, steady)]
    parts += [disagreed_words(p, data) for p in steady if not p["little"]["agreed"]]
    parts.append(short_words([p for p in probes if not p["little"]["steady"] and "edge_bound" in p["little"]], data))
    parts += [f"{probe_words(p, data)} was not judged ({p['little']['why']})" for p in probes
              if not p["little"]["steady"] and "edge_bound" not in p["little"]]
    return "; ".join(part for part in parts if part) + "."


def short_words(probes: list[dict], data: dict) -> str:
    """The probes whose windows were too short to judge: which, how many times their longest request their windows
    span, and how far their edges could move the agreement (ranges over them)."""
    if not probes:
        return ""
    spans = [p["little"]["window_s"] / p["little"]["longest_in_system_s"] for p in probes]
    bounds = [p["little"]["edge_bound"] for p in probes]
    many = len(probes) > 1
    return (f"{len(probes)} {'were' if many else 'was'} not steady ({engine_levels_words(probes, data)}): "
            f"{'their windows span' if many else 'its window spans'} {span_range(spans, '.2g', 'x')} "
            f"{'their' if many else 'its'} longest request, so {'their' if many else 'its'} edges could move the "
            f"agreement by {span_range([100 * b for b in bounds], '.3g', '%')}")


def span_range(values: list[float], spec: str, unit: str) -> str:
    """'1.1-3.9x', or '2.2x' for one value (or equal ones)."""
    low, high = format(min(values), spec), format(max(values), spec)
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def engine_levels_words(probes: list[dict], data: dict) -> str:
    """'HF at 2 users and vLLM at 4, 8 and 6 users': each engine's levels in the order probed, once each."""
    parts = []
    for name in dict.fromkeys(p["engine"] for p in probes):
        levels = list(dict.fromkeys(p["level"] for p in probes if p["engine"] == name))
        numbers = [level_words(v, data["unit"]).split(" ", 1) for v in levels]
        unit = numbers[-1][1] if len(numbers) == 1 else data["unit"]  # '1 user', '2 and 4 users'
        parts.append(f"{registry.label(name)} at {join_words([n for n, _ in numbers])} {unit}")
    return join_words(parts)


def probe_words(probe: dict, data: dict) -> str:
    """'HF at 8 users' (', second run' for a repeat)."""
    again = ", second run" if probe["repeat"] else ""
    return f"{registry.label(probe['engine'])} at {level_words(probe['level'], data['unit'])}{again}"


def agreed_words(agreed: list[dict], steady: list[dict]) -> str:
    """How many steady probes agreed within AGREE, with the range of their agreement."""
    if not steady:
        return ""
    values = [p["little"]["agreement"] for p in agreed]
    low, high = (f"{v:.2f}" for v in (min(values, default=0), max(values, default=0)))
    spread = "" if not values else f" (computed / measured {low}" + ("" if low == high else f"-{high}") + ")"
    share = "all of them" if len(agreed) == len(steady) else f"{len(agreed)} of them"
    return f"{share} agreed within {AGREE:.0%}{spread}"


def disagreed_words(probe: dict, data: dict) -> str:
    """A steady probe that disagreed: its agreement, the most its edges explain, and what the rest is."""
    little = probe["little"]
    head = (f"{probe_words(probe, data)} disagreed: computed / measured {little['agreement']:.2f}, of which its "
            f"edges explain at most {percent_words(little['edge_bound'])}")
    if little["users"] and little["mean_in_system"] < little["users"] * (1 - AGREE):
        return (f"{head}; it held {little['mean_in_system']:.2g} requests in the system on average for "
                f"{little['users']} users (think time or the client kept users out of it)")
    if little.get("arrival_rate_req_s") and little["throughput_req_s"] < little["arrival_rate_req_s"] * (1 - AGREE):
        return (f"{head}; it finished {little['throughput_req_s']:.3g} req/s of {little['arrival_rate_req_s']:.3g} "
                f"arriving (measured): it fell behind the schedule, and more requests were in flight at the "
                f"window's end than on average")
    return head


def old_little_line(data: dict) -> str:
    """A search stored before the steady window: its check compared the computed L with the users set (closed
    loop) and called a probe steady when they agreed."""
    checked = [p for p in data["probes"] if (p.get("little") or {}).get("agreement") is not None]
    if not checked:
        return ""
    steady = sum(1 for p in checked if p["little"]["steady"])
    against = "the users set" if data["mode"] == "users" else "the measured mean number in the system"
    return (f"Little's law (stored before the steady-window rule; computed L against {against}) agreed within "
            f"{AGREE:.0%} in {steady} of {len(checked)} probes, over windows from each probe's first arrival to "
            f"its last end.")


def repeat_line(data: dict) -> str:
    """How many levels sat near a limit and were run twice."""
    repeated = [p for p in data["probes"] if p["repeat"] == 1]
    if not repeated:
        return ""
    names = ", ".join(f"{registry.label(p['engine'])} at {level_words(p['level'], data['unit'])}" for p in repeated)
    return (f"{len(repeated)} level{'s' if len(repeated) > 1 else ''} sat within {NEAR:.0%} of a limit and ran "
            f"twice ({names}); each was decided on the mean of its two runs' percentiles.")


def stop_lines(data: dict) -> list[str]:
    """An engine whose search stopped early: its capacity is a lower bound."""
    return [f"{registry.label(name)}'s search ended early ({found['ended']}): its capacity is a lower bound."
            for name, found in data["capacity"].items() if found["ended"] not in ("done", "not run", RUNNING, WAITING)
            and found["bound"] == "at_least"]


def limit_lines(data: dict) -> list[str]:
    """Per engine, which target broke first (at the lowest level that missed it) or, where no level missed, which
    came nearest its limit: from the probes' measured percentiles."""
    return [line for name in data["engines"] if (line := limit_line(name, data))]


def limit_line(name: str, data: dict) -> str:
    """One engine's: what broke its target first, or what came nearest ('' before its first probe)."""
    runs = [p for p in data["probes"] if p["engine"] == name]
    failed_at = data["capacity"][name]["failed_at"]
    if not runs:
        return ""
    if failed_at is None:
        return nearest_words(name, runs, data)
    return broke_words(name, [p for p in runs if p["level"] == failed_at], data)


def target_label(target: dict) -> str:
    """'TTFT p95'."""
    return f"{target['metric'].upper()} p{target['percentile']:g}"


def level_values(runs: list[dict]) -> dict[str, float | None]:
    """A level's target values as its verdict read them: one run's, or the mean of its two (None where one has
    none)."""
    if len(runs) == 1:
        return runs[0]["values"]
    return {k: None if v is None or runs[1]["values"].get(k) is None else (v + runs[1]["values"][k]) / 2
            for k, v in runs[0]["values"].items()}


def broke_words(name: str, runs: list[dict], data: dict) -> str:
    """'HF broke the target first on TTFT p95 (5.13 s against 2 s) at 2 users, while TPOT p95 held (42.3 ms,
    within 100 ms); measured.'"""
    values = level_values(runs)
    broke, held = [], []
    for t in data["targets"]:
        value = values.get(t["name"])
        if value is None:
            broke.append(f"{target_label(t)} (no value: its rank fell among failed requests)")
        elif value > t["limit_s"]:
            broke.append(f"{target_label(t)} ({seconds_words(value)} against {seconds_words(t['limit_s'])})")
        else:
            held.append(f"{target_label(t)} ({seconds_words(value)}, within {seconds_words(t['limit_s'])})")
    both = ", the mean of its two runs there" if len(runs) > 1 else ""
    kept = f", while {join_words(held)} held" if held else ""
    return (f"{registry.label(name)} broke the target first on {join_words(broke)} at "
            f"{level_words(runs[0]['level'], data['unit'])}{kept} (measured{both}).")


def nearest_words(name: str, runs: list[dict], data: dict) -> str:
    """An engine that missed at no level probed: the target that came nearest its limit, and where."""
    shares = [(p["values"][t["name"]] / t["limit_s"], p, t) for p in runs for t in data["targets"]
              if p["values"].get(t["name"]) is not None]
    if not shares:
        return ""
    share, probe, t = max(shares, key=lambda found: found[0])
    return (f"{registry.label(name)} missed the target at no level probed; nearest its limit came "
            f"{target_label(t)}: {seconds_words(probe['values'][t['name']])} at "
            f"{level_words(probe['level'], data['unit'])}, {share:.0%} of its {seconds_words(t['limit_s'])} "
            f"(measured; the share computed).")


# -- 03's exercise: the learner's predicted capacity ratio beside the one found ----------------------------------------

def capacity_guess_answer(prediction, data: dict) -> list[str]:
    """03's capacity exercise: the learner's predicted vLLM/HF capacity ratio beside the one the search found
    (computed from its measured probes, said by its bound), then the search's own sentences
    (lab.capacity.capacity_answer: the headline, what broke each engine's target first, Little's law, the repeats)."""
    return [guess_line(prediction, (data.get("ratios") or {}).get("vllm/hf")), *capacity_answer(data)]


def guess_line(prediction, ratio: dict | None) -> str:
    """A predicted ratio against a found one ({value, bound}: exact, at_least, at_most, unknown, none)."""
    if not ratio or ratio["value"] is None:
        return "The search found no ratio to set a prediction against: the headline below says why."
    value, bound = ratio["value"], ratio["bound"]
    said = f"{bound.replace('_', ' ') + ' ' if bound in ('at_least', 'at_most') else ''}{value:.2g}x"
    found = f"the capacities the search found give {said} ({kind('arithmetic')} from its measured probes)"
    if prediction is None:
        return f"You left your prediction blank; {found}."
    return f"You predicted {prediction}x; {found}: " + _guess_words(float(prediction), value, bound)


def _guess_words(guess: float, value: float, bound: str) -> str:
    """Whether a guess is above, below or at a ratio, or (for a bound) consistent with it."""
    if bound == "unknown":
        return "both capacities are lower bounds (each search stopped before a level missed), so neither side is shown."
    if bound == "at_least":
        return (f"your guess is within the bound: a search to more users could still find {guess:g}x." if guess >= value
                else "your guess is below what was found, even as a bound: vLLM served more users than you expected.")
    if bound == "at_most":
        return (f"your guess is within the bound: a search of HF to more users could still find {guess:g}x."
                if guess <= value else "your guess is above what was found, even as a bound.")
    if abs(guess / value - 1) <= 0.1:
        return "your guess matched it (within 10%)."
    return f"your guess was {'above' if guess > value else 'below'} it, {guess / value:.2g}x what was found."
