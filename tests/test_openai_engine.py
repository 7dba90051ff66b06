"""The endpoint engine's pure parts (lab/engines/openai.py): request bodies per dialect, SSE events, and
token counts settled by the server's usage. The real servers are in test_serve.py."""

import json

import pytest

from lab.config import Endpoint, EngineConfig
from lab.engines.base import GenRequest, RequestRejected
from lab.engines.openai import Dialect, OpenAIEngine, event_tokens, read_event, request_body

REQUEST = GenRequest("r1", (5, 6, 7), 4)


def test_each_dialect_asks_for_exact_lengths_its_own_way():
    ids = request_body(Dialect.TOKEN_IDS, "m", REQUEST, "")
    assert ids["prompt"] == [5, 6, 7] and ids["ignore_eos"] and ids["min_tokens"] == 4 and ids["return_token_ids"]
    text = request_body(Dialect.TRANSFORMERS, "m", REQUEST, "hello")
    assert text["prompt"] == "hello" and json.loads(text["generation_config"])["min_new_tokens"] == 4
    plain = request_body(Dialect.TEXT, "m", REQUEST, "hello")
    assert "ignore_eos" not in plain and "generation_config" not in plain and plain["max_tokens"] == 4


def test_events_give_token_ids_or_one_unknown_token_per_text_chunk():
    assert read_event(b": keep-alive") is None and read_event(b"data: [DONE]") is None
    assert event_tokens(read_event(b'data: {"choices": [{"text": "a", "token_ids": [9, 10]}]}')) == (9, 10)
    assert event_tokens({"choices": [{"text": " Paris"}]}) == (-1,)
    assert event_tokens({"choices": [], "usage": {"completion_tokens": 3}}) is None
    with pytest.raises(RequestRejected, match="mid-stream"):
        event_tokens({"error": "boom"})


def test_usage_settles_the_count_across_events_of_one_read():
    engine = OpenAIEngine(Endpoint("http://127.0.0.1:1"), EngineConfig(), "unused")
    events = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
    tokens: tuple = ()
    for event in events:
        tokens += engine._take(REQUEST, event, len(tokens))
    assert tokens == (-1, -1, -1, -1)  # two text chunks, then two more the server counted
    assert engine._take(REQUEST, {"choices": [], "usage": {"completion_tokens": 4}}, 4) == ()  # exact: nothing added
