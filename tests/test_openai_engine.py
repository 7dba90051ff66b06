"""The endpoint engine's pure parts (lab/engines/openai.py): request bodies per dialect, SSE events, and
token counts settled by the server's usage. The real servers are in test_serve.py."""

import asyncio
import json
import time

import pytest

from lab.config import Endpoint, EngineConfig
from lab.engines.base import GenRequest, RequestRejected
from lab.engines.openai import Dialect, OpenAIEngine, cached_tokens, event_tokens, read_event, request_body

REQUEST = GenRequest("r1", (5, 6, 7), 4)


def test_each_dialect_asks_for_exact_lengths_its_own_way():
    ids = request_body(Dialect.TOKEN_IDS, "m", REQUEST, "")
    assert ids["prompt"] == [5, 6, 7] and ids["ignore_eos"] and ids["min_tokens"] == 4 and ids["return_token_ids"]
    text = request_body(Dialect.TRANSFORMERS, "m", REQUEST, "hello")
    assert text["prompt"] == "hello" and json.loads(text["generation_config"])["min_new_tokens"] == 4
    plain = request_body(Dialect.TEXT, "m", REQUEST, "hello")
    assert "ignore_eos" not in plain and "generation_config" not in plain and plain["max_tokens"] == 4


def test_a_chat_turn_goes_as_messages_and_its_usage_says_the_cache_hits():
    turn = GenRequest("c1", (5, 6, 7), 4, turn=2, messages=(("user", "hi"), ("assistant", "yo"), ("user", "more")))
    body = request_body(Dialect.TOKEN_IDS, "m", turn, "")
    assert "prompt" not in body and body["messages"][2] == {"role": "user", "content": "more"}
    assert body["ignore_eos"] and body["min_tokens"] == 4 and body["return_token_ids"]
    assert "prompt" not in request_body(Dialect.TRANSFORMERS, "m", turn, "text")
    assert event_tokens({"choices": [{"delta": {"content": " Paris"}}]}) == (-1,)
    assert event_tokens({"choices": [{"delta": {"role": "assistant"}}]}) is None
    assert cached_tokens({"usage": {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}}) == 256
    assert cached_tokens({"usage": {"prompt_tokens": 3}}) is None and cached_tokens(None) is None


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


@pytest.mark.parametrize("steps", [False, True], ids=["own-timers", "engine-steps"])
def test_tokens_are_stamped_when_their_bytes_arrive_never_before_they_were_sent(steps):
    """Against the bench's fake server, which stamps each chunk right before its write: every token's time is
    at or after its send (one clock), counts are exact, and the engine says its times are arrivals."""
    from bench.fake_openai_server import fetch_stamps, free_port, serve_in_subprocess
    from lab.model import resolve_model
    from lab.session import run_async

    async def stream_two(url: str):
        engine = OpenAIEngine(Endpoint(url, model="fake"), EngineConfig(), resolve_model(None))
        info = await engine.start()
        try:
            runs = [[c async for c in engine.stream(GenRequest(f"t{i}", (5, 6, 7), 6))] for i in range(2)]
        finally:
            await engine.stop()
        return info, runs

    with serve_in_subprocess(free_port(), gap_ms=10, first_ms=5, steps=steps) as url:
        info, runs = run_async(stream_two(url))
        sent = fetch_stamps(url)["requests"]
    assert info.args["token_times"] == "arrival"
    for i, chunks in enumerate(runs):
        times = [c.time_s for c in chunks for _ in c.token_ids]
        assert len(times) == 6 and times == sorted(times)
        assert all(got >= left for got, left in zip(times, sent[f"t{i}"]["sent_s"], strict=True))


def test_a_consumer_that_reads_late_still_gets_the_arrival_times():
    """Tokens that reached the socket while the consumer was busy keep their arrival time, not the time they
    were read (one chunk then holds them all, stamped with the last arrival: never after the consumer woke)."""
    from bench.fake_openai_server import free_port, serve_in_subprocess
    from lab.model import resolve_model
    from lab.session import run_async

    async def read_late(url: str):
        engine = OpenAIEngine(Endpoint(url, model="fake"), EngineConfig(), resolve_model(None))
        await engine.start()
        try:
            stream, woke = engine.stream(GenRequest("late", (5, 6, 7), 4)), []
            first = await anext(stream)
            await asyncio.sleep(0.3)  # the other three tokens arrive meanwhile
            woke.append(time.perf_counter())
            rest = [c async for c in stream]
        finally:
            await engine.stop()
        return first, rest, woke[0]

    with serve_in_subprocess(free_port(), gap_ms=20, first_ms=5) as url:
        first, rest, woke_s = run_async(read_late(url))
    assert sum(len(c.token_ids) for c in rest) == 3
    assert all(first.time_s <= c.time_s < woke_s for c in rest)


def test_after_a_reset_metrics_reads_wait_for_one_of_the_levels_tokens():
    """vLLM's gauges show its last step until it takes another: after a reset (a level's start) a read is kept
    only once one of the new requests' tokens has arrived, not while the first waits for its prefill."""
    from bench.fake_openai_server import free_port, serve_in_subprocess
    from lab.engines.prometheus import Scrape
    from lab.model import resolve_model
    from lab.session import run_async

    async def one_level(url: str):
        engine = OpenAIEngine(Endpoint(url, model="fake"), EngineConfig(), resolve_model(None))
        await engine.start()  # the fake server has no /metrics: the reads below are stubbed

        async def scrape():
            return Scrape({"kv_usage": 0.5, "running": 1.0}, 91, 128)

        engine._scrape, engine.has_metrics = scrape, True  # start()'s reader has not run yet: it reads the stub
        try:
            await engine.reset()
            chunks = [c async for c in engine.stream(GenRequest("r", (5, 6, 7), 4))]
            await asyncio.sleep(0.3)
        finally:
            await engine.stop()
        return chunks[0].time_s, engine.drain_samples()

    with serve_in_subprocess(free_port(), gap_ms=150, first_ms=700) as url:
        first_token_s, samples = run_async(one_level(url))
    assert samples and all(s.time_s >= first_token_s for s in samples)


def test_a_redirect_is_refused_not_followed():
    """A server that redirects (here to an address nothing should reach) is an error at the probe and for each
    request: the lab never asks the place a redirect names."""
    import http.server
    import threading

    from lab.engines.openai import probe
    from lab.model import resolve_model
    from lab.session import run_async

    asked = []

    class Redirects(http.server.BaseHTTPRequestHandler):
        def _redirect(self):
            asked.append(self.path)
            self.send_response(307)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _redirect

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}", model="m")
    try:
        with pytest.raises(ValueError, match="HTTP 307, a redirect to 'http://169.254.169.254/.*follows no redirect"):
            probe(endpoint)
        engine = OpenAIEngine(endpoint, EngineConfig(), resolve_model(None))

        async def one():
            await engine.start()
            try:
                return [c async for c in engine.stream(GenRequest("r", (5, 6), 2))]
            finally:
                await engine.stop()

        with pytest.raises(RequestRejected, match="HTTP 307"):  # followed, it would have failed to connect
            run_async(one())
    finally:
        server.shutdown()
    assert asked[:2] == ["/v1/models", "/v1/models"] and asked[-1] == "/v1/completions"  # each got only a 307
