"""The room's predictions: each page's answer to a run's headline before it runs, set against what it measured.

A workshop's presenter opens predictions for the next load test (its vLLM/HF output tok/s ratio at the top user
level) or the next Why ladder (which chain step is largest at its top level). Each page, attendees included, may
give one answer: anonymous (kept under the page's session, never shown with it), a second one replaces the first,
a ratio a number within LOWEST-HIGHEST, a step one of the ladder's steps. The round attaches to the next task of its
kind as it starts (which closes it), is stored with that task under ``predictions`` (``Round.stored``), and, once the
task has ended, holds the measured answer. Showing the answers only then keeps the room from anchoring on each other.

Pure: the host holds a Round; the page draws ``histogram``'s bins and the words of ``round_words`` and
``room_sentence``; lab.plots.predict draws the figure.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from lab.config import decimal
from lab.experiments.ladder import CHAIN, RUNGS, largest_clear, skip_reason
from lab.metrics import ratios_by_users
from lab.store import top_level
from lab.words import spread_words

RATIO, STEP = "ratio", "step"
QUESTIONS = {RATIO: "vLLM/HF output tok/s at the next load test's top user level",
             STEP: "the largest step of the next Why ladder (at its top user level)"}
TASKS = {RATIO: "load test", STEP: "Why ladder"}
LOWEST, HIGHEST = 0.1, 1000.0  # a ratio's bounds: 10x slower to 1000x faster holds every honest guess
MAX_PAGES = 500  # answers kept per round: a room of 30, with room for open tabs, and a bound on what is mirrored
NEAR = 0.2  # a prediction within 20% of the measured ratio counts as near it


@dataclass
class Round:
    """One round of predictions, from the presenter's Open to its task's end.

    Attributes:
        kind: RATIO or STEP.
        choices: The steps a STEP answer chooses from ('hf → hf-cb', ...); empty for RATIO.
        answers: Page id -> its answer (a ratio, or a step).
        open: Whether pages may answer now.
        task_id: The run or ladder it is attached to (None until one starts).
        ended: Whether that task has ended (its measured answer is then set, or None if it measured none).
        measured: The ratio at the top level, or the largest step clear of 1.
        spread: The measured answer's repeats: n, mean, low, high (for a step, its factor's value as the mean).
    """

    kind: str
    choices: tuple[str, ...] = ()
    answers: dict[str, float | str] = field(default_factory=dict)
    open: bool = True
    task_id: str | None = None
    ended: bool = False
    measured: float | str | None = None
    spread: dict | None = None

    def answer(self, page: str, raw) -> str:
        """Keep ``page``'s answer (replacing its last); its words. ValueError, naming the value, the bounds and the
        way out, for a closed round, a bad value or a full room."""
        if not self.open:
            raise ValueError("predictions are closed: the presenter opens them before the next run")
        value = parse_answer(self.kind, raw, self.choices)
        if page not in self.answers and len(self.answers) >= MAX_PAGES:
            raise ValueError(f"this round holds {MAX_PAGES} predictions, its limit: the room has answered")
        replaced, self.answers[page] = self.answers.get(page), value
        said = f"Your prediction: {answer_words(self.kind, value)}"
        if replaced is None or replaced == value:
            return f"{said}."
        return f"{said} (replaces {answer_words(self.kind, replaced)})."

    def attach(self, task_id: str) -> None:
        """The task this round predicts has started: the round closes and goes with it."""
        self.task_id, self.open = task_id, False

    def measure(self, data: dict) -> None:
        """Its task has ended: take the measured answer from the task's stored dict (summary.json, or the ladder's
        experiment.json)."""
        self.measured, self.spread = (measured_ratio if self.kind == RATIO else measured_step)(data)
        self.ended = True

    def stored(self) -> dict:
        """What the task's stored record keeps under ``predictions`` (the report draws it)."""
        return {"question": QUESTIONS[self.kind], "kind": self.kind, "choices": list(self.choices),
                "values": list(self.answers.values()), "measured": self.measured, "spread": self.spread,
                "open": self.open}

    def view(self) -> dict:
        """What a page draws: the stored record, the task it went with and whether that has ended."""
        return self.stored() | {"task_id": self.task_id, "ended": self.ended}


def new_round(kind: str, device: str) -> Round:
    """An open round of ``kind`` (ValueError naming the kinds for another)."""
    if kind not in QUESTIONS:
        raise ValueError(f"predictions: unknown question {kind!r}; choose {RATIO} or {STEP}")
    return Round(kind, ladder_steps(device) if kind == STEP else ())


def ladder_steps(device: str) -> tuple[str, ...]:
    """The chain steps a full ladder measures on ``device`` (a rung the device cannot run merges its step with the
    next), as the Why tab names them."""
    ran = [name for name in CHAIN if skip_reason(name, device, tuple(RUNGS)) is None]
    return tuple(step_name(lower, upper) for lower, upper in zip(ran, ran[1:], strict=False))


def step_name(lower: str, upper: str) -> str:
    return f"{lower} → {upper}"


# -- one answer ------------------------------------------------------------------------------------
def parse_answer(kind: str, raw, choices: tuple[str, ...]) -> float | str:
    """A page's answer checked: a ratio within LOWEST-HIGHEST ('3', '3x', 3.0), or one of ``choices``."""
    if kind == STEP:
        if raw not in choices:
            raise ValueError(f"Prediction: choose one of the ladder's steps ({'; '.join(choices)}), not "
                             f"{shown(raw)}")
        return raw
    text = raw.strip().rstrip("xX×").strip() if isinstance(raw, str) else raw
    try:
        value = decimal(text, "Prediction") if text not in (None, "") else None
    except ValueError:
        value = None
    if value is None or not LOWEST <= value <= HIGHEST:
        given = shown(raw if value is None else value)
        raise ValueError(f"Prediction: give a ratio from {LOWEST:g} to {HIGHEST:g}, not {given} (3 means vLLM makes "
                         f"3x HF's output tok/s; 0.5, half as much)")
    return value


def shown(raw) -> str:
    """An answer as a refusal names it: 'nothing', 2000, 'abc'."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return "nothing"
    return f"{raw:g}" if isinstance(raw, (int, float)) and not isinstance(raw, bool) else repr(raw)


def times(value: float) -> str:
    """A ratio in words, to the digits a guess carries: '0.35x', '4.6x', '12x'."""
    return f"{value:.2f}x" if value < 1 else f"{value:.1f}x" if value < 10 else f"{value:.0f}x"


def answer_words(kind: str, value) -> str:
    return times(value) if kind == RATIO else str(value)


# -- the measured answer ---------------------------------------------------------------------------
def measured_ratio(summary: dict) -> tuple[float | None, dict | None]:
    """vLLM/HF output tok/s at the run's top measured level (as the Results table has it) and its repeats'
    spread; (None, None) where the run measured no ratio there (one engine, or nothing finished)."""
    if not summary.get("runs"):
        return None, None
    top, rows = top_level(summary)
    return ratios_by_users(rows).get(top), summary.get("spread", {}).get("ratio", {}).get(str(top))


def measured_step(fields: dict) -> tuple[str | None, dict | None]:
    """The ladder's largest chain step clear of 1 at its top level (the rule of its headline) and that factor;
    (None, None) where no step's repeats stand clear of 1."""
    found = largest_clear(fields.get("factors") or [])
    if found is None:
        return None, None
    return step_name(found["lower"], found["upper"]), {"n": found["n"], "mean": found["value"],
                                                        "low": found["low"], "high": found["high"]}


# -- what the room said ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Bin:
    """One bar of the histogram: answers from low (inclusive) to high."""

    low: float
    high: float
    count: int


def histogram(values: list[float], measured: float | None = None) -> list[Bin]:
    """The answers in bins of equal width on a log scale (a ratio's guesses span decades), wide enough to hold
    the measured value too; a single value gets one bin of +-10% around it."""
    if not values:
        return []
    ends = values + ([measured] if measured else [])
    low, high = min(ends) / 1.1, max(ends) * 1.1
    count = min(12, max(3, math.ceil(math.sqrt(len(values))) + 1))
    edges = [low * (high / low) ** (i / count) for i in range(count + 1)]
    return [Bin(lo, hi, sum(lo <= v < hi for v in values))
            for lo, hi in zip(edges, edges[1:], strict=False)]


def step_counts(values: list[str], choices: tuple[str, ...] | list[str]) -> dict[str, int]:
    """How many chose each step: every choice (0 where none did), then any other step answered, most first."""
    counted = Counter(values)
    return {step: counted.get(step, 0) for step in choices} | {s: n for s, n in counted.most_common()
                                                                 if s not in choices}


def room_sentence(view: dict | None) -> str:
    """The room against the measured answer, computed from the round: '' before any round or while its task has not
    ended; 'No predictions...' when nobody answered."""
    if view is None or not view["ended"]:
        return ""
    values = view["values"]
    if not values:
        return f"No predictions for this {TASKS[view['kind']]}."
    return (ratio_sentence if view["kind"] == RATIO else step_sentence)(values, view["measured"], view["spread"])


def ratio_sentence(values: list[float], measured: float | None, spread: dict | None) -> str:
    """'7 predictions, median 3.0x; measured 4.6x: the room underestimated by 1.5x; 2 of 7 within 20%.'"""
    mid = statistics.median(values)
    head = (f"1 prediction, {times(mid)}" if len(values) == 1 else
            f"{len(values)} predictions, median {times(mid)} (from {times(min(values))} to {times(max(values))})")
    if measured is None:
        return f"{head}; the run measured no vLLM/HF ratio at a level (it needs both engines to finish one)."
    near = sum(abs(v / measured - 1) <= NEAR for v in values)
    return (f"{head}; measured {times(measured)}{repeats_words(spread)}: {median_words(mid, measured, spread)}; "
            f"{near} of {len(values)} within {NEAR:.0%}.")


def repeats_words(spread: dict | None) -> str:
    """' (repeats 4.2x-5.0x)' where the ratio was measured more than once, else ''."""
    return f" (repeats {times(spread['low'])}-{times(spread['high'])})" if spread and spread["n"] > 1 else ""


def median_words(mid: float, measured: float, spread: dict | None) -> str:
    """Where the room's median lies: within the measured repeats (no side called), within NEAR, or how far off."""
    if spread and spread["n"] > 1 and spread["low"] <= mid <= spread["high"]:
        return "the room's median lies within the measured repeats"
    if abs(mid / measured - 1) <= NEAR:
        return f"the room's median is within {NEAR:.0%} of it"
    if mid < measured:
        return f"the room underestimated by {times(measured / mid)}"
    return f"the room overestimated by {times(mid / measured)}"


def step_sentence(values: list[str], measured: str | None, spread: dict | None) -> str:
    """'5 predictions: 3 chose hf → hf-cb, 2 vllm-hf-code → vllm; measured: the largest step was hf → hf-cb
    (2.10x, repeats 1.90-2.30x, n=3): 3 of 5 right.'"""
    counted = Counter(values).most_common()
    chose = ", ".join(f"{n} {'chose ' if i == 0 else ''}{step}" for i, (step, n) in enumerate(counted))
    head = f"{len(values)} prediction{'s' if len(values) > 1 else ''}: {chose}"
    if measured is None:
        return f"{head}; measured: no step's repeats stand clear of 1, so the ladder names no largest step."
    right = sum(v == measured for v in values)
    return (f"{head}; measured: the largest step was {measured} ({spread['mean']:.2f}x, {spread_words(spread)}): "
            f"{right} of {len(values)} right.")


def round_words(view: dict | None) -> str:
    """The line over the predictions: what is asked and how many answered (never what they answered: the room
    would anchor), or that the answers show once the task has ended."""
    if view is None:
        return "No predictions open: the presenter opens them before a run."
    n, task = len(view["values"]), TASKS[view["kind"]]
    made = f"{n} prediction{'' if n == 1 else 's'}"
    if view["task_id"] is None:
        if view["open"]:
            return (f"**Predictions open** for {view['question']}: {made} so far. One per page, anonymous; a new one "
                    f"replaces yours.")
        return f"Predictions closed: {made}, for the next {task} (the presenter may open them again)."
    if not view["ended"]:
        return f"Predictions closed: {made} for {task} {view['task_id']}; the answers show here once it ends."
    return f"The room against {task} {view['task_id']} (its answers, and what it measured):"
