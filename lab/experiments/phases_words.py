"""The phases experiment in words (notebook 03): what more users bought decode- and prefill-bound work in each
engine, and whether vLLM's tok/s kept growing with the users, judged on the repeats' spread (measured).
"""

from __future__ import annotations

import math

from lab.engines import registry
from lab.experiments.ladder import clear
from lab.words import gain_words, spread_words


def _apart(a: dict | None, b: dict | None) -> bool:
    """Two gains' repeats do not overlap (one repeat each: nothing to say they do)."""
    if not a or not b or a["n"] < 2 or b["n"] < 2:
        return True
    return a["high"] < b["low"] or b["high"] < a["low"]


def phases_answer(fields: dict, most: int) -> list[str]:
    """Each engine's gain on decode- and prefill-bound work from the fewest users to ``most``, and which work and
    which engine gained more here (measured, with the repeats' spread), each reason chosen by the gains."""
    gains = {(w, e): fields[w][e]["gain"] for w in ("decode", "prefill") for e in ("hf", "vllm")}
    spreads = {(w, e): fields[w][e].get("gain_spread") for w in ("decode", "prefill") for e in ("hf", "vllm")}

    def words(key):
        return gain_words(gains[key], spreads[key])

    lines = [f"From 1 to {most} users HF {words(('decode', 'hf'))} on decode-bound work and "
             f"{words(('prefill', 'hf'))} on prefill-bound work; vLLM {words(('decode', 'vllm'))} "
             f"and {words(('prefill', 'vllm'))} (measured)."]
    if not _apart(spreads["decode", "vllm"], spreads["prefill", "vllm"]):
        lines.append("vLLM's decode and prefill gains overlap within their repeats' spread: no measured difference "
                     "between the two kinds of work here.")
    elif gains["decode", "vllm"] > gains["prefill", "vllm"]:
        lines.append("Decode gained more in vLLM: a decode step reads every weight once to make one token per running "
                     "request, so more requests in a step make more tokens from the same read; a prefill step already "
                     "computes a whole prompt's tokens, so more prompts in a step add work with every token they add.")
    else:
        lines.append("Here prefill gained as much as decode in vLLM: the device was already busy with one "
                     "request's decode steps, so sharing them bought little.")
    return lines + _hf_prefill_lines(gains, spreads, most) + [_hf_line(gains, spreads, most)]


def _bound(gain: float, most: int) -> str:
    """How much a step's cost grew at most from 1 to ``most`` users, given a tok/s gain: a step ran at most ``most``
    times the rows, so its cost grew at most most / gain (computed)."""
    return f"{most / gain:.2f}x"


def _fixed_share(gain: float, most: int) -> float:
    """The least share of a 1-user step that was fixed cost, if a step's cost is a fixed part plus a part per row and
    rows grew with the users: cost(most) / cost(1) <= most / gain."""
    return 1 - max(0.0, most / gain - 1) / (most - 1) if most > 1 else 0.0


def _floor_pct(share: float) -> str:
    """A least share in words, rounded down: '99%', never a bound rounded up past what it is."""
    return f"{math.floor(share * 100)}%"


def _hf_prefill_lines(gains: dict, spreads: dict, most: int) -> list[str]:
    """Where HF's prefill-bound work gained clearly more than vLLM's, why: its step's cost barely grew with rows."""
    hf, vllm = gains["prefill", "hf"], gains["prefill", "vllm"]
    if hf <= vllm or not _apart(spreads["prefill", "hf"], spreads["prefill", "vllm"]):
        return []
    return [f"HF's prefill-bound work gained more than vLLM's ({hf:.2f}x against {vllm:.2f}x): "
            f"{_cost_words(hf, vllm, most)}"]


def _hf_line(gains: dict, spreads: dict, most: int) -> str:
    hf, vllm = gains["decode", "hf"], gains["decode", "vllm"]
    if not _apart(spreads["decode", "hf"], spreads["decode", "vllm"]):
        return "On decode-bound work HF's and vLLM's gains overlap within their repeats' spread."
    if hf < vllm:
        return ("On decode-bound work HF gained less than vLLM: its batch is fixed when it starts (padding, waiting "
                "for the longest) while vLLM refills its batch every step.")
    said = f"On decode-bound work HF gained more than vLLM ({hf:.2f}x against {vllm:.2f}x): "
    return said + _cost_words(hf, vllm, most)


def _cost_words(hf: float, vllm: float, most: int) -> str:
    """How much a step's cost grew at most in each engine (computed from the gains), and, where the bound says so,
    that HF's 1-user step was mostly a fixed cost that more rows shared."""
    said = (f"from 1 to {most} users a step's cost grew at most {_bound(hf, most)} in HF against "
            f"{_bound(vllm, most)} in vLLM (computed: users / gain)")
    share = _fixed_share(hf, most)
    if share < 0.5:
        return said + "."
    return said + (f", so at least {_floor_pct(share)} of HF's 1-user step was a fixed cost that more rows shared "
                   f"(computed, if a step's cost grows in step with its rows).")


def more_users_answer(decode: dict, more: dict, users: tuple[int, int]) -> list[str]:
    """The exercise: the decode-bound gain at more users against the first run's (measured) of each engine the
    exercise ran, and whether vLLM's tok/s kept growing with the users, flattened, or the repeats cannot say
    (growth_line)."""
    first, second = users
    said = [f"{registry.label(e)} {gain_words(decode[e]['gain'], decode[e].get('gain_spread'))} from 1 to {first} "
            f"users and {gain_words(more[e]['gain'], more[e].get('gain_spread'))} from 1 to {second}"
            for e in ("vllm", "hf") if e in more]
    return [f"On decode-bound work {'; '.join(said)} (measured).",
            growth_line(step_of(decode["vllm"], more["vllm"]), users)]


def step_of(first: dict, second: dict) -> dict:
    """The second gain over the first, with its spread: the repeats' own steps where measured (``step`` and
    ``step_spread``, lab.experiments.phases.step_up), else the widest the two gains' spreads allow."""
    if second.get("step_spread"):
        return {"value": second["step"], **second["step_spread"]}
    value = second["gain"] / first["gain"]
    a, b = first.get("gain_spread"), second.get("gain_spread")
    if not a or not b or min(a["n"], b["n"]) < 2:
        return {"value": value, "low": value, "high": value, "n": 1}
    return {"value": value, "low": b["low"] / a["high"], "high": b["high"] / a["low"], "n": min(a["n"], b["n"])}


def growth_bar(users: tuple[int, int]) -> float:
    """The step that counts as still growing with the users: half the users' growth (2x the users: 1.5x)."""
    return 1 + 0.5 * (users[1] / users[0] - 1)


def kept_growing(step: dict, users: tuple[int, int]) -> bool | None:
    """Whether every repeat's step reached growth_bar (True), none did (False), or the repeats straddle it (None:
    no verdict)."""
    bar = growth_bar(users)
    if step["low"] >= bar:
        return True
    return False if step["high"] < bar else None


def growth_line(step: dict, users: tuple[int, int]) -> str:
    """From ``users[0]`` to ``users[1]``: vLLM's tok/s step against growth_bar, judged on its repeats."""
    first, second = users
    said = (f"From {first} to {second} users ({second / first:.2f}x) vLLM's tok/s moved {step['value']:.2f}x "
            f"({spread_words(step)}); growing with the users means at least {growth_bar(users):.2f}x (half their "
            f"growth)")
    verdict = kept_growing(step, users)
    if verdict is None:
        return said + (": the repeats straddle that line, so this run cannot say whether it kept growing or "
                       "flattened (more repeats, or a higher level, would).")
    if verdict:
        return said + (": every repeat reached it, so it kept growing: a step was not yet compute-bound and the pool "
                       "held every running request.")
    how = ("the extra users bought no measured tok/s (the repeats straddle 1)" if not clear(step) else
           "it even fell, in every repeat" if step["high"] < 1 else "it grew, but short of the line in every repeat")
    return said + (f": {how}, so it flattened. A step is compute-bound once more rows cost as much as they make (on "
                   f"a 2-core CPU that comes early; on a GPU much later), or the KV pool cannot hold every running "
                   f"request.")
