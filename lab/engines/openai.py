"""An OpenAI-compatible server as an engine (``openai``): the lab load-tests it over HTTP like any other.

Each request streams ``/v1/completions``; a chat turn (a request with messages, the chat workload) streams
``/v1/chat/completions`` with its messages, and the server applies its own chat template. How much the server
accepts decides the dialect, found once at start by asking for 4 tokens:

- ``token-ids`` (vLLM): the prompt goes as token ids (every engine sees the same tokens), exact lengths
  through ``ignore_eos`` + ``min_tokens``, token ids back through ``return_token_ids``.
- ``transformers`` (``transformers serve``): a text prompt, exact lengths through its ``generation_config``
  (``min_new_tokens``); the server counts the prompt's tokens (its ``usage``).
- ``text``: plain OpenAI fields; outputs may stop at EOS, so lengths are what the server made.

A chunk's time is when its bytes reached the lab's socket layer, before any parsing (aiohttp's protocol
notes each arrival, so the lab's own parse queue is not counted in TTFT/ITL; a read that gathered several
arrivals takes the last one's time, never earlier than its tokens came); a chunk without token ids counts as
one token, and the ``usage`` at the end settles the count. HTTP errors, time-outs and a server that dies
mid-run end that request as an error; the run goes on. While requests run, ``/metrics`` is read 4 times a second
(lab.engines.prometheus) into the same samples as the in-process engines'. The API key is sent, never
logged or stored. No redirect is followed (an answer of 3xx is an error): where one leads is not an address
the endpoint rules (lab.app.access) checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import errno
import functools
import json
import logging
import socket
import time
from collections.abc import AsyncIterator

from lab.config import API_KEY_ENV, Endpoint, EngineConfig, is_public
from lab.engines.base import EngineInfo, GenRequest, RequestRejected, SampleBuffer, TokenChunk, check_fits
from lab.engines.prometheus import Scrape, parse_metrics, to_sample

try:  # orjson parses a chunk in a third of json's time (bench/client_overhead.py)
    from orjson import dumps, loads
except ImportError:  # pragma: no cover - orjson comes with gradio
    from json import loads

    def dumps(value) -> bytes:
        return json.dumps(value).encode()

log = logging.getLogger(__name__)
SCRAPE_EVERY_S = 0.25  # /metrics read 4 times a second while requests run (the issue asks >= 2 Hz)
SCRAPE_TIMEOUT_S = 5.0  # a busy server on a loaded CPU can take seconds to answer (3.1 s seen on 2 cores)
PROBE_TOKENS = 4


class ConnectionLost(RequestRejected):
    """The connection broke (reset, or closed by the server): the request is an error like any other."""


class Dialect(enum.StrEnum):
    """What a server's /v1/completions accepts (see the module docstring)."""

    TOKEN_IDS = "token-ids"
    TRANSFORMERS = "transformers"
    TEXT = "text"


def request_body(dialect: Dialect, model: str, request: GenRequest, prompt_text: str) -> dict:
    """The JSON body of one streamed completion in ``dialect`` (a chat turn's: its messages, no prompt)."""
    body = {"model": model, "max_tokens": request.max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    prompt = list(request.prompt_token_ids) if dialect is Dialect.TOKEN_IDS else prompt_text
    if request.messages is not None:
        body["messages"] = [{"role": role, "content": text} for role, text in request.messages]
    else:
        body["prompt"] = prompt
    if dialect is Dialect.TOKEN_IDS:
        exact = {"ignore_eos": True, "min_tokens": request.max_tokens} if request.ignore_eos else {}
        return {**body, "return_token_ids": True, **exact}
    if dialect is Dialect.TRANSFORMERS:
        config = {"do_sample": False, "max_new_tokens": request.max_tokens}
        if request.ignore_eos:
            config["min_new_tokens"] = request.max_tokens
        body["generation_config"] = json.dumps(config)
        body.pop("stream_options")  # transformers serve sends usage anyway and warns about the field
    return body


def read_event(raw: bytes) -> dict | None:
    """One SSE event's data as JSON; None for comments, keep-alives and the final [DONE]."""
    start = raw.find(b"data:")
    if start < 0:
        return None
    data = raw[start + 5:].strip()
    if not data or data == b"[DONE]":
        return None
    return loads(data)


def event_tokens(event: dict) -> tuple[int, ...] | None:
    """The token ids one event carries (), or None for an event without tokens (a usage-only chunk)."""
    if "error" in event:
        raise RequestRejected(f"the server reported an error mid-stream: {event['error']}")
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if choice.get("token_ids") is not None:
        return tuple(choice["token_ids"])
    text = choice.get("text") or (choice.get("delta") or {}).get("content")  # a completion's, or a chat delta's
    return (-1,) if text else None  # text without ids: one token, id unknown


def cached_tokens(event: dict | None) -> int | None:
    """The prompt tokens the server found in its prefix cache, where its usage says (vLLM with
    --enable-prompt-tokens-details)."""
    usage = (event or {}).get("usage") or {}
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


@functools.cache
def arrival_handler() -> type:
    """aiohttp's client protocol, noting when bytes last reached it (before its parser sees them)."""
    from aiohttp.client_proto import ResponseHandler

    class ArrivalHandler(ResponseHandler):
        __slots__ = ("arrived_s",)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.arrived_s = 0.0

        def data_received(self, data: bytes) -> None:
            if data:  # aiohttp calls it with b"" when it resumes reading: nothing arrived then
                self.arrived_s = time.perf_counter()
            ResponseHandler.data_received(self, data)

    return ArrivalHandler


def note_arrivals(connector) -> bool:
    """Make the connector's connections note arrivals; False (tokens stamped when parsed) where aiohttp has moved
    its protocol factory, which it does not expose: the lab says so in the engine args."""
    from aiohttp.client_proto import ResponseHandler

    factory = getattr(connector, "_factory", None)
    if not (isinstance(factory, functools.partial) and factory.func is ResponseHandler):
        log.warning("this aiohttp builds its connections another way: tokens are stamped when parsed")
        return False
    connector._factory = functools.partial(arrival_handler(), *factory.args, **factory.keywords)
    return True


class ParseTime:
    """Where arrivals are not noted: a read's time is when it is parsed."""

    @property
    def arrived_s(self) -> float:
        return time.perf_counter()


def arrivals(response):
    """What tells when the response's bytes last arrived: its connection's protocol, kept from the start (the
    connection is released at the body's end, before the last read returns, or at once when the whole body
    came with the headers: then the response's own reference to it)."""
    protocol = response.connection.protocol if response.connection else getattr(response, "_protocol", None)
    return protocol if hasattr(protocol, "arrived_s") else ParseTime()


def auth_headers(endpoint: Endpoint) -> dict:
    """The bearer-token header the endpoint's key asks for (none without a key)."""
    return {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}


def _no_redirects():
    """urllib's redirect handler, refusing every redirect: the 3xx answer reaches the caller as an HTTPError."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return NoRedirect()


def only_public(host: str, found: list, address_of) -> list:
    """The public ones of the addresses ``host`` resolved to (``found``; ``address_of`` reads one's IP).

    Raises:
        OSError: none is public (EACCES, the first address named: its strerror is what aiohttp shows).
    """
    public = [each for each in found if is_public(address_of(each))]
    if not public:
        raise OSError(errno.EACCES, f"{host} resolves to {address_of(found[0])} now, not a public address: no "
                                    f"connection made")
    return public


def public_connection(address: tuple, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
    """socket.create_connection, to the host's public addresses only (resolved as the connection is made)."""
    host, port = address
    error: OSError = OSError(f"{host}: no address answered")
    for *_, where in only_public(host, socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), lambda i: i[4][0]):
        try:
            return socket.create_connection(where[:2], timeout, source_address)  # an IP: no second lookup
        except OSError as exc:
            error = exc
    raise error


def _public_handlers() -> list:
    """urllib's HTTP and HTTPS handlers, their connections made by ``public_connection``."""
    import http.client
    import urllib.request

    def checked(connection):
        class Checked(connection):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._create_connection = public_connection  # what connect() calls (HTTPS wraps its socket)
        return Checked

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(checked(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(checked(http.client.HTTPSConnection), req, context=self._context)

    return [Http(), Https()]


def public_resolver():
    """aiohttp's resolver keeping only public addresses (an IP in the URL itself skips it: the endpoint check
    before the start saw that address)."""
    import aiohttp

    class Public(aiohttp.ThreadedResolver):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            return only_public(host, await super().resolve(host, port, family), lambda each: each["host"])

    return Public()


def probe(endpoint: Endpoint, timeout_s: float = 10.0) -> None:
    """Check before anything loads that an OpenAI server answers at the endpoint and takes its key.

    Raises:
        ValueError: nothing answers, the key is refused, or the URL is not an OpenAI server.
    """
    import urllib.error
    import urllib.request

    url = endpoint.base_url.rstrip("/") + "/v1/models"
    headers = auth_headers(endpoint)
    guards = _public_handlers() if endpoint.public_only else []
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _no_redirects(), *guards)  # no proxy sees
    #                                                                                                    the key
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        status = exc.code
        if 300 <= status < 400:
            raise ValueError(f"endpoint {endpoint.name}: {url} answered HTTP {status}, a redirect to "
                             f"{exc.headers.get('Location')!r}: the lab follows no redirect (where it leads is not "
                             f"checked against the endpoint rules); give the server's own address") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ValueError(f"endpoint {endpoint.name}: nothing answers at {endpoint.base_url} ({reason}); start "
                         f"the server first (e.g. `python -m lab serve --engine vllm`)") from None
    if status in (401, 403):
        raise ValueError(f"endpoint {endpoint.name}: {endpoint.base_url} refused the API key (HTTP {status}): "
                         f"give the server's key in the API key field (--api-key or ${API_KEY_ENV} on the CLI)")
    if status == 404:
        raise ValueError(f"endpoint {endpoint.name}: {url} answered HTTP 404: not an OpenAI-compatible server "
                         f"(give the server's root URL, e.g. http://127.0.0.1:8000, with or without /v1)")
    if endpoint.model is None:
        raise ValueError(f"endpoint {endpoint.name}: {url} answered HTTP {status}: give the served model's name "
                         f"(--served-model-name)")


class OpenAIEngine:
    """An OpenAI-compatible server (vLLM's, transformers', any other) behind the Engine protocol."""

    def __init__(self, endpoint: Endpoint, config: EngineConfig, model_path: str):
        self.name = endpoint.name
        self.endpoint = endpoint
        self.config = config
        self.model_path = model_path
        self.model = endpoint.model
        self.dialect = Dialect.TOKEN_IDS
        self.max_model_len: int | None = None
        self.tokenizer = None
        self.has_metrics = False
        self.stamped_on_arrival = False  # token times from the socket layer (else when parsed)
        self.ids_known = False  # whether the server sends its token ids back (found by the start's probe)
        self.prompt_mismatches = 0  # prompts whose server token count differed from the lab's
        self._session = None
        self.info: EngineInfo | None = None
        self._samples = SampleBuffer()
        self._in_flight = 0
        self._scraper: asyncio.Task | None = None
        self._last: Scrape | None = None
        self._gauges_ours = True  # False from a reset until one of our tokens arrives (see _scrape_loop)
        self._resets = 0  # a read begun before a reset belongs to the requests before it

    # -- start and stop ---------------------------------------------------------------------------------

    async def start(self) -> EngineInfo:
        import aiohttp
        from transformers import AutoTokenizer

        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_path)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300,  # no cap: the users are the cap
                                         resolver=public_resolver() if self.endpoint.public_only else None)
        self.stamped_on_arrival = note_arrivals(connector)
        timeout = aiohttp.ClientTimeout(total=self.endpoint.timeout_s, sock_connect=10)
        self._session = aiohttp.ClientSession(self.endpoint.base_url.rstrip("/") + "/", connector=connector,
                                              timeout=timeout, headers=auth_headers(self.endpoint))
        try:
            await self._read_models()
            self.dialect = await self._find_dialect()
            scrape = await self._scrape()
        except BaseException:
            await self.stop()  # no session or sockets left behind by a start that failed
            raise
        self.has_metrics = scrape is not None
        self._scraper = asyncio.ensure_future(self._scrape_loop())
        self.info = self._info(scrape)
        return self.info

    async def _read_models(self) -> None:
        """The served model's name and max_model_len from /v1/models (if that fails, --served-model-name)."""
        async with self._session.get("v1/models", allow_redirects=False) as response:
            if response.status != 200:
                if self.model:
                    log.warning("%s: /v1/models answered HTTP %s; using model %r", self.name, response.status,
                                self.model)
                    return
                raise RequestRejected(f"{self.endpoint.base_url}/v1/models answered HTTP {response.status}: "
                                      f"give the served model's name (--served-model-name)")
            listed = (await response.json()).get("data") or []
        if self.model and not any(m.get("id") == self.model for m in listed):  # transformers serve lists the HF
            log.warning("%s: %r is not in the server's /v1/models; using it anyway", self.name, self.model)  # cache
            return
        if not listed:
            raise RequestRejected(f"{self.endpoint.base_url}/v1/models lists no model: give --served-model-name")
        chosen = next((m for m in listed if m.get("id") == self.model), listed[0])
        self.model, self.max_model_len = chosen["id"], chosen.get("max_model_len")

    async def _find_dialect(self) -> Dialect:
        """The first dialect whose 4-token probe comes back with exactly 4 tokens (else plain text); notes
        whether the server sent token ids back (the agreement check needs them)."""
        probe = GenRequest("probe", tuple(self.tokenizer.encode("The capital of France is")), PROBE_TOKENS)
        for dialect in (Dialect.TOKEN_IDS, Dialect.TRANSFORMERS):
            ids = await self._probe(probe, dialect)
            if ids is not None and len(ids) == PROBE_TOKENS:
                self.ids_known = all(t >= 0 for t in ids)
                return dialect
        return Dialect.TEXT

    async def _probe(self, probe: GenRequest, dialect: Dialect) -> list[int] | None:
        """The probe's token ids in ``dialect``, or None if the server refused it. Asked twice when the connection
        was lost: a server may close a kept-alive connection after refusing the dialect before."""
        for attempt in range(2):
            request = dataclasses.replace(probe, request_id=f"probe-{dialect.value}-{attempt}-{time.monotonic_ns()}")
            try:
                return [t async for chunk in self._stream(request, dialect) for t in chunk.token_ids]
            except ConnectionLost as exc:
                if attempt:
                    log.info("%s: dialect %s: %s", self.name, dialect.value, exc)
            except RequestRejected as exc:
                log.info("%s: dialect %s refused (%s)", self.name, dialect.value, exc)
                return None
        return None

    def _info(self, scrape: Scrape | None) -> EngineInfo:
        args = {"base_url": self.endpoint.base_url, "served_model": self.model, "dialect": self.dialect.value,
                "exact_lengths": self.dialect is not Dialect.TEXT, "metrics": self.has_metrics,
                "token_times": "arrival" if self.stamped_on_arrival else "parsed",
                "max_model_len": self.max_model_len}
        return EngineInfo(name=self.name, args=args, kv_total_blocks=scrape.num_blocks if scrape else None,
                          kv_block_size=scrape.block_size if scrape else None)

    async def stop(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            await asyncio.gather(self._scraper, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- requests -----------------------------------------------------------------------------------------

    def check(self, request: GenRequest) -> str | None:
        return check_fits(request, self.max_model_len) if self.max_model_len else None

    def stream(self, request: GenRequest) -> AsyncIterator[TokenChunk]:
        return self._stream(request, self.dialect)

    async def _stream(self, request: GenRequest, dialect: Dialect) -> AsyncIterator[TokenChunk]:
        """Send one request and yield its tokens as they arrive, one chunk per socket read (stamped once);
        HTTP and network failures raise RequestRejected."""
        import aiohttp

        text = "" if dialect is Dialect.TOKEN_IDS else self.tokenizer.decode(request.prompt_token_ids)
        body = dumps(request_body(dialect, self.model, request, text))
        headers = {"X-Request-Id": request.request_id, "Content-Type": "application/json"}
        made, pending, cached = 0, b"", None
        path = "v1/completions" if request.messages is None else "v1/chat/completions"
        self._in_flight += 1
        try:
            async with self._session.post(path, data=body, headers=headers, allow_redirects=False) as response:
                if response.status != 200:
                    reason = (await response.text())[:300]
                    response.close()  # not back to the pool: a server's error reply may leave bytes that spoil the next
                    raise RequestRejected(f"HTTP {response.status}: {reason}")
                arrival, read = arrivals(response), response.content.readany
                try:
                    while data := await read():  # one await per socket read, not per line (b"": the body's end)
                        now = arrival.arrived_s
                        buffer = pending + data
                        if b"\r" in buffer:  # a server that ends lines with CRLF (a read may end between the two)
                            buffer = buffer.replace(b"\r\n", b"\n")
                        *events, pending = buffer.split(b"\n\n")
                        tokens: tuple[int, ...] = ()
                        for raw in events:
                            event = read_event(raw)
                            tokens += self._take(request, event, made + len(tokens))
                            cached = cached_tokens(event) if cached is None else cached
                        if tokens:
                            made += len(tokens)
                            self._gauges_ours = True
                            yield TokenChunk(now, tokens)
                except aiohttp.ClientPayloadError as exc:  # the body broke off: an error unless every token came
                    if made == 0:
                        raise ConnectionLost(f"the server closed the stream before any token ({exc})") from None
                    if made < request.max_tokens:
                        raise
                last = read_event(pending)
                cached = cached_tokens(last) if cached is None else cached
                if tail := self._take(request, last, made):  # a last event without its blank line
                    made += len(tail)
                    self._gauges_ours = True
                    yield TokenChunk(arrival.arrived_s, tail)
                if cached is not None:  # the usage comes last: its count rides on a chunk of no tokens
                    yield TokenChunk(arrival.arrived_s, (), cached_tokens=cached)
            self._check_end(request, dialect, made)
        except TimeoutError:
            raise RequestRejected(f"no answer from {self.endpoint.base_url} in time (a connection gets 10 s, a "
                                  f"request {self.endpoint.timeout_s:g} s)") from None
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            raise ConnectionLost(f"{type(exc).__name__} from {self.endpoint.base_url}: {exc}") from None
        except aiohttp.ClientError as exc:
            raise RequestRejected(f"{type(exc).__name__} from {self.endpoint.base_url}: {exc}") from None
        finally:
            self._in_flight -= 1

    @staticmethod
    def _check_end(request: GenRequest, dialect: Dialect, made: int) -> None:
        """A stream that ended with no token, or short of an exact length, is an error (what arrived is kept)."""
        if made == 0:
            raise RequestRejected("the server answered but sent no token")
        if request.ignore_eos and dialect is not Dialect.TEXT and made < request.max_tokens:
            raise RequestRejected(f"the stream ended after {made} of {request.max_tokens} tokens")

    def _take(self, request: GenRequest, event: dict | None, made: int) -> tuple[int, ...]:
        """The token ids one event adds: its own, and any that the server's final usage counts beyond those that
        arrived (-1: id unknown)."""
        if event is None:
            return ()
        tokens = event_tokens(event) or ()
        usage = event.get("usage")
        if not usage:
            return tokens
        self._check_prompt(request, usage.get("prompt_tokens"))
        missing = usage.get("completion_tokens", made + len(tokens)) - made - len(tokens)
        return tokens + (-1,) * max(0, missing)

    def _check_prompt(self, request: GenRequest, server_count: int | None) -> None:
        """Count prompts the server's tokenizer measured differently from the lab's (text dialects); warn once."""
        if server_count is None or server_count == request.prompt_len:
            return
        self.prompt_mismatches += 1
        if self.prompt_mismatches == 1:
            log.warning("%s: the server counts %d prompt tokens where the lab sent %d (text prompts are "
                        "tokenized again by the server)", self.name, server_count, request.prompt_len)

    @property
    def compares_tokens(self) -> bool:
        """Whether its output token ids are the server's own (the agreement check needs them)."""
        return self.ids_known

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode([t for t in token_ids if t >= 0], skip_special_tokens=True)

    # -- samples, reset, health -------------------------------------------------------------------------

    async def _scrape(self) -> Scrape | None:
        """One read of /metrics, or None when the server has none (or it failed just now)."""
        import aiohttp

        try:
            async with self._session.get("metrics", allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as response:
                if response.status != 200:
                    return None
                scrape = await asyncio.to_thread(parse_metrics, await response.text())
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return scrape if scrape.has_vllm else None

    async def _scrape_loop(self) -> None:
        """Read /metrics while requests are in flight (and once more after), 4 times a second. After a reset
        (a level's start) reads wait for one of the level's tokens: until a step of its own, vLLM's gauges still
        show the last step of the requests before (seen: the warm-up's blocks in a level's first read)."""
        busy_before = False
        while self.has_metrics:
            busy = self._in_flight > 0
            if (busy or busy_before) and self._gauges_ours:
                resets = self._resets
                scrape = await self._scrape()
                if scrape is not None and resets == self._resets:
                    self._add_sample(scrape)
            busy_before = busy
            await asyncio.sleep(SCRAPE_EVERY_S)

    def _add_sample(self, scrape: Scrape) -> None:
        """One scrape as a sample; a scrape that cannot become one ends the KV samples, said once in the log."""
        try:
            self._samples.add(to_sample(self.name, time.perf_counter(), scrape, self._last))
        except (TypeError, ValueError):
            log.exception("%s: /metrics could not be read as samples; no more KV samples", self.name)
            self.has_metrics = False
        self._last = scrape

    def drain_samples(self):
        return self._samples.drain()

    async def reset(self) -> None:
        """Ask the server to drop its prefix cache (vLLM's dev endpoint); a server without one keeps it. Then
        read /metrics once before the level's requests: the base of the prefix-cache counts of its first read."""
        self._gauges_ours, self._resets = False, self._resets + 1
        try:
            async with self._session.post("reset_prefix_cache", allow_redirects=False) as response:
                if response.status != 200:
                    log.debug("%s: reset_prefix_cache answered HTTP %s", self.name, response.status)
        except Exception as exc:  # noqa: BLE001 - a reset is a courtesy: the run goes on without it
            log.debug("%s: reset_prefix_cache failed: %s", self.name, exc)
        if self.has_metrics and (scrape := await self._scrape()) is not None:
            self._last = scrape

    async def abort_all(self) -> None:
        """Nothing to do: a cancelled stream closes its connection, and the server aborts that request."""

    def alive(self) -> bool:
        return self._session is not None

    def fault(self) -> str | None:
        """None while started: a server's failures are the failed requests' own errors, not the run's."""
        return None if self._session is not None else f"{self.name} is not started"
