"""The chat workload: each closed-loop user holds a conversation, and turn k re-sends the whole history.

A user's conversations are real ShareGPT ones of at least two exchanges (lab.load.sharegpt.conversations: each
user message and reply its table length), drawn from the user's own seeded stream, so every engine gets the same
turns in the same order. Turn k's prompt is the chat template over the k user messages and the k - 1 replies
before it. The replies in the history are text of the length the previous turn asked for, cut from the built-in
passage like every prompt, not the engine's own answer (engines answer differently, and ignore_eos answers are
noise): so requests are identical across engines, and turn k - 1's prompt is, token for token, the start of turn
k's (what a prefix cache can find). A conversation ends where its next turn would not fit max_model_len; the user
then starts the next one.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator

from lab.engines.base import GenRequest
from lab.load.sharegpt import conversations
from lab.load.workloads import passage_ids

MIN_TURNS = 2  # conversations of one exchange (a third of the table) are single requests, the sharegpt workload's


@functools.cache
def multi_turn() -> tuple[tuple[tuple[int, int], ...], ...]:
    """The ShareGPT conversations with at least MIN_TURNS exchanges that pass vLLM's filter."""
    return tuple(c for c in conversations() if len(c) >= MIN_TURNS)


def shortest_first_turn(output_len: int | None = None) -> tuple[int, int]:
    """The fewest tokens a conversation's first turn can have: (user message, reply), the chat template aside."""
    return min((c[0][0], output_len if output_len is not None else c[0][1]) for c in multi_turn())


def render(tokenizer, messages: list[tuple[str, str]]) -> str:
    """The prompt text of a conversation so far, ending where the assistant answers (the model's chat template;
    'role: text' lines for a tokenizer without one)."""
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": role, "content": text} for role, text in messages]
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return "".join(f"{role}: {text}\n" for role, text in messages) + "assistant:"


def passage_text(tokenizer, source: list[int], rng: random.Random, length: int) -> str:
    """Text of about ``length`` tokens cut from the passage at a seeded offset."""
    start = rng.randrange(0, len(source) - length)
    return tokenizer.decode(source[start:start + length])


def conversation(tokenizer, exchanges: tuple[tuple[int, int], ...], rng: random.Random, source: list[int],
                 max_model_len: int, output_len: int | None, exact: bool, prefix: str) -> Iterator[GenRequest]:
    """One conversation's turns, each prompt the last one's tokens plus the reply and the new user message.

    Args:
        exchanges: (user message, reply) tokens per turn.
        output_len: Force every reply's length (the history then holds replies of that length).
        exact: Ask engines to ignore EOS.
        prefix: Request-id prefix; turn k's id ends in '-t{k}'.
    """
    messages: list[tuple[str, str]] = []
    ids: list[int] = []
    before = ""
    for turn, (user, reply) in enumerate(exchanges, 1):
        reply = output_len if output_len is not None else reply
        messages.append(("user", passage_text(tokenizer, source, rng, user)))
        text = render(tokenizer, messages)
        if text.startswith(before):  # the history's tokens stay as they were sent
            ids = ids + tokenizer.encode(text[len(before):], add_special_tokens=False)
        else:  # a template that rewrites the past (e.g. drops old reasoning): tokenized anew
            ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) + reply > max_model_len:
            return
        yield GenRequest(f"{prefix}-t{turn}", tuple(ids), reply, exact, turn=turn, messages=tuple(messages))
        messages.append(("assistant", passage_text(tokenizer, source, rng, reply)))
        before = text


def user_turns(tokenizer, user: int, seed: int, max_model_len: int, output_len: int | None = None,
               exact: bool = True, prefix: str = "chat") -> Iterator[GenRequest]:
    """One user's endless stream of turns: conversation after conversation, drawn from its own seed."""
    rng = random.Random(f"chat:{seed}:{user}")
    source = passage_ids(tokenizer, 2 * 1024 + 64)  # the longest message: MAX_PROMPT user or MAX_TOTAL reply
    pool = multi_turn()
    for number in itertools.count():
        yield from conversation(tokenizer, rng.choice(pool), rng, source, max_model_len, output_len, exact,
                                f"{prefix}-u{user}-c{number}")


def chat_streams(tokenizer, users: int, per_user: int | None, seed: int, max_model_len: int,
                 output_len: int | None = None, exact: bool = True, prefix: str = "chat") -> list[Iterator[GenRequest]]:
    """Every user's turns (``per_user`` each, or endless for a time-bound level), for lab.load.driver.run_users."""
    streams = [user_turns(tokenizer, u, seed, max_model_len, output_len, exact, prefix) for u in range(users)]
    return streams if per_user is None else [itertools.islice(s, per_user) for s in streams]
