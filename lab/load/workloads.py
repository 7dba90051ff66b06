"""Workloads: seeded, controlled distributions of prompt and output lengths.

A workload names how long prompts and outputs are; ``make_requests`` turns it into tokenized requests
that every engine receives identically (same ids, same order). Prompt text is cut from a built-in
passage at a seeded offset, so prompts differ (no accidental shared prefix) and lengths are exact.
``sharegpt`` draws each request's lengths from real conversations (lab.load.sharegpt); ``chat`` replays whole
conversations, a history that grows turn by turn (lab.load.chat), and as single requests (warm-up, experiments,
the estimate) reads as ``sharegpt``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lab.engines.base import GenRequest

SEED_PROMPT = "Write a short story about AI."  # the seeds' hf_baseline.py prompt

PASSAGE = (
    "A transformer keeps the keys and values of every token it has read, so that each new token can "
    "attend to the past without computing it again. This key-value cache grows by one entry per layer "
    "for every token, and for a serving engine it is the largest thing in memory after the weights. "
    "A naive server reserves one contiguous region per request, sized for the longest answer the "
    "request might give, and holds it until the whole batch is done. Short answers leave most of that "
    "region empty, padding fills the rest, and the batch cannot take a new request until its slowest "
    "member finishes. A paged engine cuts the cache into fixed blocks of a few dozen tokens, gives a "
    "request a new block only when its last one is full, and returns blocks the moment the request "
    "ends. A block table maps each request's logical blocks to physical ones, the way an operating "
    "system maps virtual pages to frames. Because memory is no longer wasted, many more requests fit "
    "at once, and because the scheduler works one step at a time, a finished request's place is taken "
    "by a waiting one on the very next step. Requests whose prompts begin the same way can even share "
    "blocks. The lighthouse keeper counted the ships at dawn, wrote the weather in a blue notebook, "
    "and walked the stairs twice before the kettle boiled. The river behind the mill ran fast after "
    "the spring rain, carrying leaves, a lost oar and the songs of children who had never seen the "
    "sea. In the market the baker argued about the price of flour while the clockmaker listened, "
    "smiling, because every argument in that town ended at noon when the bells rang. "
)


@dataclass(frozen=True)
class Workload:
    """Length ranges (inclusive) of one workload preset."""

    name: str
    description: str
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    fixed_prompt: str | None = None
    real: str | None = None  # lengths drawn from the ShareGPT table: its words for them in brief()

    def brief(self) -> str:
        """Prompt and output lengths in a few characters, e.g. 'mixed 16-512 → 16-256'."""
        def span(low: int, high: int) -> str:
            return str(low) if low == high else f"{low}-{high}"

        if self.real:
            return f"{self.name} {self.real}"
        prompt = "seed prompt" if self.fixed_prompt else span(*self.prompt_len)
        return f"{self.name} {prompt} → {span(*self.output_len)}"


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("mixed", "varied prompts (16-512 tokens) and outputs (16-256 tokens)", (16, 512), (16, 256)),
        Workload("equal", "hf_baseline.py of the seeds: the same prompt, 128 new tokens each",
                 (0, 0), (128, 128), fixed_prompt=SEED_PROMPT),
        Workload("decode", "decode-bound: short prompts (16-64), long outputs (256-512)", (16, 64), (256, 512)),
        Workload("prefill", "prefill-bound: long prompts (512-1536), short outputs (8-32)", (512, 1536), (8, 32)),
        Workload("spread", "answers spread 12x: short prompts (16-64), outputs 8-96 tokens", (16, 64), (8, 96)),
        Workload("sharegpt", "real chat lengths: ShareGPT first turns, filtered as vllm bench does", (4, 1024),
                 (4, 2044), real="ShareGPT first turns"),
        Workload("chat", "multi-turn: each user holds a ShareGPT conversation, every turn re-sends the history",
                 (4, 1024), (4, 2044), real="ShareGPT conversations, history re-sent"),
    )
}


FIXED_PROMPT_BOUND = 32  # tokens a fixed prompt may take (the seed prompt is 8 words)


def longest_request(workload: str, output_len: int | None = None) -> tuple[int, int]:
    """The longest prompt and output one request of ``workload`` can have (tokens).

    Args:
        workload: A key of WORKLOADS.
        output_len: A forced output length, else the workload's own longest.

    Returns:
        (prompt tokens, output tokens) at their maximum.
    """
    preset = WORKLOADS[workload]
    if preset.real:
        return longest_real(output_len)
    prompt = preset.prompt_len[1] if preset.fixed_prompt is None else FIXED_PROMPT_BOUND
    return prompt, output_len if output_len is not None else preset.output_len[1]


def mean_request(workload: str, output_len: int | None = None) -> tuple[float, float]:
    """The mean prompt and output tokens of one request of ``workload`` (the ranges' midpoints; computed)."""
    preset = WORKLOADS[workload]
    prompt = sum(preset.prompt_len) / 2 if preset.fixed_prompt is None else FIXED_PROMPT_BOUND / 2
    return prompt, output_len if output_len is not None else sum(preset.output_len) / 2


def longest_real(output_len: int | None) -> tuple[int, int]:
    """The ShareGPT first turn with the most tokens in all (a chat's later turns are cut to max_model_len)."""
    from lab.load.sharegpt import first_turns

    if output_len is not None:
        return max(p for p, _ in first_turns()), output_len
    return max(first_turns(), key=sum)


@dataclass(frozen=True)
class RequestSpec:
    """The lengths of one request before tokenization."""

    prompt_len: int
    output_len: int


def sample_specs(workload: str, count: int, seed: int, output_len: int | None = None) -> list[RequestSpec]:
    """Draw ``count`` request lengths for a workload, repeatably.

    Args:
        workload: A key of WORKLOADS.
        count: How many requests.
        seed: Same seed, same lengths.
        output_len: Force every output length (tokens).

    Returns:
        The lengths, in sending order.
    """
    preset = WORKLOADS[workload]
    rng = random.Random(seed)
    if preset.real:
        return real_specs(rng, count, output_len)
    specs = []
    for _ in range(count):
        prompt = rng.randint(*preset.prompt_len)
        out = output_len if output_len is not None else rng.randint(*preset.output_len)
        specs.append(RequestSpec(prompt, out))
    return specs


def real_specs(rng: random.Random, count: int, output_len: int | None) -> list[RequestSpec]:
    """``count`` ShareGPT first turns drawn with replacement (an output_len forced replaces each reply's)."""
    from lab.load.sharegpt import first_turns

    pairs = rng.choices(first_turns(), k=count)
    return [RequestSpec(prompt, output_len if output_len is not None else out) for prompt, out in pairs]


def passage_ids(tokenizer, min_tokens: int) -> list[int]:
    """The built-in passage as token ids, repeated until it has at least ``min_tokens``."""
    ids = tokenizer.encode(PASSAGE, add_special_tokens=False)
    repeats = max(1, -(-min_tokens // len(ids)) + 1)
    return ids * repeats


def make_requests(tokenizer, workload: str, count: int, seed: int, output_len: int | None = None,
                  exact_lengths: bool = True, prefix: str = "req") -> list[GenRequest]:
    """Tokenized requests of a workload; identical for every engine given the same arguments.

    Args:
        tokenizer: Any HF tokenizer of the model.
        workload: A key of WORKLOADS.
        count: How many requests.
        seed: Seed of lengths and prompt offsets.
        output_len: Force every output length.
        exact_lengths: Ask engines to ignore EOS so outputs have exactly their length.
        prefix: Request-id prefix.

    Returns:
        GenRequests in sending order.
    """
    preset = WORKLOADS[workload]
    specs = sample_specs(workload, count, seed, output_len)
    rng = random.Random(seed + 1)
    if preset.fixed_prompt is not None:
        fixed = tuple(tokenizer.encode(preset.fixed_prompt))
    else:
        source = passage_ids(tokenizer, max(s.prompt_len for s in specs) * 2)
    requests = []
    for i, spec in enumerate(specs):
        if preset.fixed_prompt is not None:
            prompt = fixed
        else:
            start = rng.randrange(0, len(source) - spec.prompt_len)
            prompt = tuple(source[start:start + spec.prompt_len])
        requests.append(GenRequest(f"{prefix}-{i}", prompt, spec.output_len, exact_lengths))
    return requests


def chat_request(tokenizer, text: str, max_tokens: int, request_id: str = "chat") -> GenRequest:
    """A single-turn chat prompt through the model's chat template, stopping at EOS.

    Args:
        tokenizer: The model's tokenizer (with a chat template).
        text: The user's message.
        max_tokens: Cap on the answer's length.
        request_id: Id of the request.

    Returns:
        A request that ends at EOS or max_tokens.
    """
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    return GenRequest(request_id, tuple(ids), max_tokens, ignore_eos=False)
