"""The ladder: HF's output tok/s taken to vLLM's one mechanism at a time, and the ratio split into factors.

Rungs form a chain, each differing from the one before by one mechanism vLLM adds to HF's baseline:
hf (static batches, eager) -> hf-cb (continuous batching and paged KV, transformers' own code) -> vllm-hf-code
(vLLM's engine: its scheduler, paged KV and batching, still running transformers' model code) -> vllm-eager
(vLLM's own model code and kernels, eager) -> vllm-compiled (torch.compile, no CUDA graphs) -> vllm (CUDA
graphs). The order follows what a request meets first: how requests are batched, then whose engine schedules
them, then whose code and kernels run a step, then what each step costs the CPU. Three side rungs are compared
with one chain rung each, outside the product: hf-compiled (HF's own fix for step overhead, against hf),
vllm-engine (vLLM's step loop, against the served vllm) and offline (LLM.generate's loop over LLMEngine, against
vllm). Each rung names the `vllm serve` flags that make it. Each engine declares its own rungs in its registry entry
(``EngineSpec.rungs``, lab/engines/registry.py); this module reads them there at each use.

A factor is the geometric mean, over the repeats, of the upper rung's tok/s over the lower's in the same
repeat (the rungs are interleaved, so a repeat pairs runs made minutes apart at most). The total (vllm over hf)
is the same mean of each repeat's vllm / hf, so the chain's factors multiply to it exactly. A skipped rung
merges its step with the next: that factor spans both mechanisms, less any that cannot exist on the device
(CUDA graphs on a CPU). Pure: no engine, no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lab.engines import registry
from lab.engines.registry import BASELINE, RATIO_TOP, Rung


def chain() -> dict[str, Rung]:
    """The chain rungs (set against none), in ladder order."""
    return {n: r for n, r in registry.rungs().items() if not r.against}


def sides() -> dict[str, str]:
    """Side rung -> the chain rung it is set against."""
    return {n: r.against for n, r in registry.rungs().items() if r.against}


RUNGS, CHAIN, SIDES = registry.View(registry.rungs), registry.View(chain), registry.View(sides)  # read at each use


METHOD = ("Rungs form a chain, each adding one mechanism to the rung before, in the order a request meets them: "
          "how requests are batched (hf -> hf-cb), whose engine schedules them (hf-cb -> vllm-hf-code: vLLM's engine "
          "on transformers' model code), whose model code and kernels run a step (-> vllm-eager), what a step costs "
          "the CPU (-> vllm-compiled: torch.compile; -> vllm: CUDA graphs). A factor is the geometric mean over the "
          "repeats of one rung's tok/s over the rung below in the same repeat, so the chain's factors multiply to "
          "vllm / hf. A skipped rung merges its step with the next (that factor spans both mechanisms, less any the "
          "device lacks). Side rungs (hf-compiled, vllm-engine, offline) are set against one chain rung, outside "
          "the product.")


def check_rungs(names) -> tuple[str, ...]:
    """The asked-for rungs in ladder order, or ValueError naming an unknown one and the choices."""
    names = tuple(names)
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung {unknown[0]!r}; choose from {', '.join(RUNGS)}")
    if not names:
        raise ValueError(f"rungs: choose at least hf and vllm from {', '.join(RUNGS)}")
    missing = [n for n in (BASELINE, RATIO_TOP) if n not in names]
    if missing:
        raise ValueError(f"rungs: {missing[0]} is needed (the ratio runs from {BASELINE} to {RATIO_TOP}); got "
                         f"{', '.join(names)}")
    return tuple(n for n in RUNGS if n in names)


def skip_reason(name: str, device: str, asked: tuple[str, ...]) -> str | None:
    """Why a rung does not run here, or None."""
    if name not in asked:
        return "not asked for (--rungs)"
    if RUNGS[name].cuda_only and device != "cuda":
        return RUNGS[name].cuda_only
    return None


def geo_mean(values) -> float | None:
    """The geometric mean of positive values (None when there are none)."""
    data = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, data)) / len(data)) if data else None


@dataclass(frozen=True)
class Factor:
    """One step of the ladder: upper / lower tok/s, its spread over the repeats and what it isolates."""

    lower: str
    upper: str
    mechanism: str
    value: float
    low: float
    high: float
    n: int
    in_product: bool

    def to_dict(self) -> dict:
        return asdict(self)


def paired(tok_s: dict[str, list[float | None]], lower: str, upper: str) -> list[float]:
    """upper / lower in each repeat where both ran."""
    pairs = zip(tok_s.get(lower, []), tok_s.get(upper, []), strict=False)
    return [u / lo for lo, u in pairs if lo and u]


def step_mechanism(lower: str, upper: str, device: str) -> str:
    """What a chain step spans: the upper rung's mechanism and those of skipped rungs between (less the absent)."""
    order = list(CHAIN)
    names = order[order.index(lower) + 1: order.index(upper) + 1]
    parts = [RUNGS[n].mechanism for n in names if not (device != "cuda" and RUNGS[n].cpu_absent)]
    return " + ".join(parts) or RUNGS[upper].mechanism


def factor(tok_s: dict, lower: str, upper: str, mechanism: str, in_product: bool) -> Factor | None:
    """The factor between two rungs, or None when no repeat has both."""
    ratios = paired(tok_s, lower, upper)
    if not ratios:
        return None
    return Factor(lower, upper, mechanism, geo_mean(ratios), min(ratios), max(ratios), len(ratios), in_product)


def decompose(tok_s: dict[str, list[float | None]], device: str) -> dict:
    """The chain's factors (their product is the total), the side factors and the total, from measured tok/s.

    Args:
        tok_s: Rung name -> output tok/s per repeat (None where a repeat did not finish).
        device: 'cpu' or 'cuda' (which mechanisms can exist).

    Returns:
        {"total": Factor hf -> vllm or None, "factors": chain factors, "sides": side factors, "product": the
        chain factors' product}, each Factor as a dict.
    """
    ran = [n for n in CHAIN if any(tok_s.get(n, []))]
    steps = [factor(tok_s, lo, up, step_mechanism(lo, up, device), True) for lo, up in zip(ran, ran[1:], strict=False)]
    sides = [factor(tok_s, base, side, RUNGS[side].mechanism, False) for side, base in SIDES.items()]
    total = factor(tok_s, BASELINE, RATIO_TOP, "everything vLLM adds to HF's baseline", False)
    steps = [s for s in steps if s is not None]
    return {"total": total.to_dict() if total else None, "factors": [s.to_dict() for s in steps],
            "sides": [s.to_dict() for s in sides if s is not None],
            "product": math.prod(s.value for s in steps) if steps else None}


def largest(factors: list[dict]) -> dict | None:
    """The chain factor farthest from 1 (a loss counts by its inverse), or None."""
    return max(factors, key=lambda f: abs(math.log(f["value"])), default=None)


def clear(factor: dict) -> bool:
    """A factor (or any spread of n, low, high) whose repeats do not straddle 1 (one repeat counts as clear: there is
    no spread to say): the one rule every sentence that judges a change by its repeats follows."""
    return factor["n"] == 1 or not factor["low"] <= 1 <= factor["high"]


def largest_clear(factors: list[dict]) -> dict | None:
    """The largest factor among those clear of 1 (the one rule every headline of the lab follows), or None."""
    return largest([f for f in factors if clear(f)])
