"""A fast fake OpenAI-compatible server on loopback that stamps every token it sends.

It answers ``POST /v1/completions`` with ``stream: true`` (prompt as text or token ids): after
``--first-ms`` it streams ``max_tokens`` SSE chunks ``--gap-ms`` apart (``choices[0].text``, and
``choices[0].token_ids`` when the request asks ``"return_token_ids": true``, as vLLM does), then a usage
chunk when ``stream_options.include_usage`` and ``data: [DONE]``. Each chunk carries its own send time
as ``"sent_s"`` (time.perf_counter(), CLOCK_MONOTONIC: comparable across processes on Linux), stamped
right before the write. Per request (keyed by the ``X-Request-Id`` header, else a counter) it keeps the
arrival time and every send time; ``GET /stamps`` returns them as JSON, ``GET /stamps?reset=1`` also
forgets them. ``GET /v1/models`` names one model (``--model``, default ``fake``).

It is a raw asyncio Protocol with a minimal HTTP/1.1 parser (keep-alive, chunked transfer encoding,
a listen backlog of 4,096 for a 1,000-connection burst) on uvloop, one timer per stream (or, with
``--steps``, one for all: every gap one pass sends each running stream's next token, as an engine step
does, so a client gets a burst of 1,000 chunks at once). Measured on one
core of a 2-core AMD EPYC VM (bench.client_overhead, 1,000 streams, 50 ms gap = 20,000 chunks/s): it
spends ~25 us of CPU per chunk sent and stays within ~1-2 ms of its schedule at p99 on a quiet machine;
aiohttp.web on the same core (``--impl aiohttp``, kept for comparison) spends ~40-45 us per chunk and ran
tens of ms late at p99. ``/stamps`` also reports the lateness, the server's CPU time and the connections
it accepted since the last reset, so a client bench can tell a slow client from a slow server.

Usage: python -m bench.fake_openai_server [--port 8123] [--gap-ms 20] [--first-ms 0] [--cpu 0] [--steps]
Import: ``with serve_in_subprocess(port, gap_ms=20, cpu=0) as url: ...``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("fake_openai_server")
BACKLOG = 4096  # the default (100) drops part of a 1,000-connection burst into SYN retries


class Stamps:
    """Arrival and send times per request, and how late each token left against its schedule."""

    def __init__(self) -> None:
        self.requests: dict[str, dict] = {}
        self.late_s: list[float] = []
        self._counter = 0
        self._cpu0_s = time.process_time()
        self.connections = 0  # opened since the last reset

    def arrive(self, request_id: str | None, tokens: int) -> tuple[str, list[float]]:
        """Record one request's arrival and the tokens it asks for; returns its key and the list its send
        times go to."""
        if not request_id:
            self._counter += 1
            request_id = f"req-{self._counter}"
        sent: list[float] = []
        self.requests[request_id] = {"arrival_s": time.perf_counter(), "tokens": tokens, "sent_s": sent}
        return request_id, sent

    def as_json(self, reset: bool) -> bytes:
        late = sorted(self.late_s)
        body = {"requests": self.requests, "late_ms": _percentiles_ms(late), "chunks": len(late),
                "cpu_s": time.process_time() - self._cpu0_s, "connections": self.connections}
        if reset:
            self.requests, self.late_s, self._cpu0_s, self.connections = {}, [], time.process_time(), 0
        return json.dumps(body).encode()


def _percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))] * 1e3  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": values[-1] * 1e3}


def models_body(model: str) -> bytes:
    return json.dumps({"object": "list", "data": [
        {"id": model, "object": "model", "created": 0, "owned_by": "kvlab", "root": model, "max_model_len": 1 << 20},
    ]}).encode()


def prompt_tokens(prompt) -> int:
    """A prompt's length in tokens: a token-id list's length, else a word count."""
    if isinstance(prompt, list):
        return len(prompt[0]) if prompt and isinstance(prompt[0], list) else len(prompt)
    return len(str(prompt).split())


class Completion:
    """The token schedule of one streamed completion; ``chunk(k)`` and ``tail()`` are its SSE bytes."""

    def __init__(self, body: dict, model: str):
        self.tokens = max(0, int(body.get("max_tokens") or 16))
        self.with_ids = bool(body.get("return_token_ids"))
        self.usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.prompt_len = prompt_tokens(body.get("prompt", ""))
        self.model = model
        self.name("0")

    def name(self, key: str) -> None:
        """Set the completion's id (cmpl-KEY) in every chunk."""
        self.head = f'{{"id":"cmpl-{key}","object":"text_completion","created":0,"model":"{self.model}"'

    def chunk(self, k: int, sent_s: float) -> bytes:
        ids = f',"token_ids":[{7 + k % 1000}]' if self.with_ids else ""
        finish = '"length"' if k == self.tokens - 1 else "null"
        return (f'data: {self.head},"choices":[{{"index":0,"text":" t{k}"{ids},"logprobs":null,'
                f'"finish_reason":{finish},"stop_reason":null}}],"sent_s":{sent_s:.7f}}}\n\n').encode()

    def tail(self) -> bytes:
        usage = ""
        if self.usage:
            usage = (f'data: {self.head},"choices":[],"usage":{{"prompt_tokens":{self.prompt_len},'
                     f'"completion_tokens":{self.tokens},"total_tokens":{self.prompt_len + self.tokens}}}}}\n\n')
        return (usage + "data: [DONE]\n\n").encode()


def _framed(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer encoding)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype
            + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests (keep-alive) and streams completions by loop timers."""

    def __init__(self, server: FakeServer):
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.streaming = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.stamps.connections += 1

    def connection_lost(self, exc) -> None:
        if self.timer:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.streaming and self.transport:
            request = self._take_request()
            if request is None:
                return
            self.server.dispatch(self, *request)

    def _take_request(self):
        """(method, target, headers, body) of the next complete request in the buffer, else None."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", 0))
        if len(self.buffer) < end + 4 + length:
            return None
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        return method, target, headers, body

    def stream(self, completion: Completion, sent: list[float], first_s: float, gap_s: float) -> None:
        """Send the SSE head now and every token on its schedule (first_s after arrival, then gap_s apart), by
        its own timer, or by the server's shared steps (--steps)."""
        self.streaming = True
        self.transport.write(SSE_HEAD)
        if completion.tokens == 0:
            self.transport.write(_framed(completion.tail()) + b"0\r\n\r\n")
            self._finish()
        elif self.server.steps is not None:
            self.server.steps.add(self, completion, sent, first_s)
        else:
            self._by_timer(completion, sent, first_s, gap_s)

    def _by_timer(self, completion: Completion, sent: list[float], first_s: float, gap_s: float) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + first_s  # uvloop's loop.time() is cached per loop pass, in ms

        def send(k: int) -> None:
            due = start + k * gap_s
            if self.send_token(completion, sent, k, due) is False:
                self.timer = loop.call_later(max(0.0, due + gap_s - time.perf_counter()), send, k + 1)

        self.timer = loop.call_later(first_s, send, 0)

    def send_token(self, completion: Completion, sent: list[float], k: int, due: float) -> bool | None:
        """Write token k (and the end after the last one), stamped now: True when the stream ended, None when the
        client has gone."""
        if self.transport is None:
            return None
        now = time.perf_counter()
        self.server.stamps.late_s.append(max(0.0, now - due))
        sent.append(now)
        data = completion.chunk(k, now)
        if k < completion.tokens - 1:
            self.transport.write(_framed(data))
            return False
        self.transport.write(_framed(data + completion.tail()) + b"0\r\n\r\n")
        self._finish()
        return True

    def _finish(self) -> None:
        self.streaming, self.timer = False, None
        if self.buffer:  # a pipelined next request
            self.data_received(b"")


class Steps:
    """Engine-like timing (--steps): every gap, one pass sends the next token of every stream that is due, as
    vLLM's engine step does for all running requests; a new stream joins the first step after first_s."""

    def __init__(self, gap_s: float):
        self.gap_s = gap_s
        self.streams: list[list] = []  # [connection, completion, sent, next k, ready_s]
        self.timer: asyncio.TimerHandle | None = None

    def add(self, conn: HttpConnection, completion: Completion, sent: list[float], first_s: float) -> None:
        self.streams.append([conn, completion, sent, 0, time.perf_counter() + first_s])
        if self.timer is None:
            self._step(time.perf_counter() + self.gap_s)

    def _step(self, due: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(max(0.0, due - time.perf_counter()), self._send, due)

    def _send(self, due: float) -> None:
        running = []
        for entry in self.streams:
            conn, completion, sent, k, ready_s = entry
            if ready_s > due:
                running.append(entry)
            elif conn.send_token(completion, sent, k, due) is False:
                entry[3] = k + 1
                running.append(entry)
        self.streams = running
        self.timer = None
        if running:
            self._step(due + self.gap_s)


class FakeServer:
    """Routes parsed requests; holds the stamps and the timing settings."""

    def __init__(self, gap_ms: float, first_ms: float, model: str, steps: bool = False):
        self.gap_s, self.first_s, self.model = gap_ms / 1e3, first_ms / 1e3, model
        self.steps = Steps(self.gap_s) if steps else None
        self.stamps = Stamps()
        self._models = models_body(model)

    def dispatch(self, conn: HttpConnection, method: str, target: str, headers: dict, body: bytes) -> None:
        url = urlsplit(target)
        if method == "POST" and url.path == "/v1/completions":
            self.complete(conn, headers, body)
        elif method == "GET" and url.path == "/v1/models":
            conn.transport.write(_response("200 OK", self._models))
        elif method == "GET" and url.path == "/stamps":
            reset = parse_qs(url.query).get("reset", ["0"])[0] not in ("0", "")
            conn.transport.write(_response("200 OK", self.stamps.as_json(reset)))
        elif method == "GET" and url.path in ("/health", "/ping"):
            conn.transport.write(_response("200 OK", b"{}"))
        else:
            conn.transport.write(_response("404 Not Found", b'{"error":"not found"}'))

    def complete(self, conn: HttpConnection, headers: dict, body: bytes) -> None:
        try:
            request = json.loads(body)
        except ValueError:
            conn.transport.write(_response("400 Bad Request", b'{"error":"body is not JSON"}'))
            return
        if not request.get("stream"):
            conn.transport.write(_response("400 Bad Request", b'{"error":"only stream: true is served"}'))
            return
        completion = Completion(request, self.model)
        key, sent = self.stamps.arrive(headers.get("x-request-id"), completion.tokens)
        completion.name(key)
        conn.stream(completion, sent, self.first_s, self.gap_s)


async def serve_raw(host: str, port: int, server: FakeServer) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: HttpConnection(server), host, port, backlog=BACKLOG)
    log.info("fake OpenAI server (raw protocol) on http://%s:%d, gap %.1f ms", host, port, server.gap_s * 1e3)
    async with srv:
        await srv.serve_forever()


async def serve_aiohttp(host: str, port: int, server: FakeServer) -> None:
    """The same server on aiohttp.web (slower: kept to compare)."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        completion = Completion(await request.json(), server.model)
        key, sent = server.stamps.arrive(request.headers.get("X-Request-Id"), completion.tokens)
        completion.name(key)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = time.perf_counter() + server.first_s
        for k in range(completion.tokens):
            due = start + k * server.gap_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()
            server.stamps.late_s.append(max(0.0, now - due))
            sent.append(now)
            await response.write(completion.chunk(k, now))
        await response.write(completion.tail())
        await response.write_eof()
        return response

    async def models(_request):
        return web.Response(body=server._models, content_type="application/json")

    async def stamps(request):
        return web.Response(body=server.stamps.as_json(request.query.get("reset", "0") not in ("0", "")),
                            content_type="application/json")

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models),
                    web.get("/stamps", stamps)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=BACKLOG).start()
    log.info("fake OpenAI server (aiohttp.web) on http://%s:%d", host, port)
    await asyncio.Event().wait()


def run_server(host: str, port: int, gap_ms: float, first_ms: float, model: str, impl: str, loop: str,
               steps: bool = False) -> None:
    server = FakeServer(gap_ms, first_ms, model, steps)
    main = serve_raw if impl == "raw" else serve_aiohttp
    if loop == "uvloop":
        import uvloop
        uvloop.run(main(host, port, server))
    else:
        asyncio.run(main(host, port, server))


def wait_until_up(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll GET /v1/models until it answers 200 (raises if the process exits or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"fake server exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"fake server at {url} did not answer in {timeout_s:.0f} s")
        time.sleep(0.05)


def fetch_stamps(url: str, reset: bool = False) -> dict:
    """The server's stamps (GET /stamps), optionally forgetting them."""
    with urllib.request.urlopen(f"{url}/stamps?reset={int(reset)}", timeout=30) as reply:
        return json.loads(reply.read())


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serve_in_subprocess(port: int, gap_ms: float = 20.0, first_ms: float = 0.0, cpu: int | None = None,
                        model: str = "fake", impl: str = "raw", loop: str = "uvloop",
                        steps: bool = False) -> Iterator[str]:
    """Start the server in a subprocess (pinned to ``cpu`` if given), wait until it answers, yield its URL."""
    cmd = [sys.executable, "-m", "bench.fake_openai_server", "--port", str(port), "--gap-ms", str(gap_ms),
           "--first-ms", str(first_ms), "--model", model, "--impl", impl, "--loop", loop]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if steps:
        cmd.append("--steps")
    url = f"http://127.0.0.1:{port}"
    if port_in_use(port):
        raise RuntimeError(f"port {port} is taken (another server?): stamps would come from the wrong server")
    proc = subprocess.Popen(cmd)
    try:
        wait_until_up(url, proc=proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--gap-ms", type=float, default=20.0, help="time between two tokens of a stream")
    parser.add_argument("--first-ms", type=float, default=0.0, help="time from arrival to the first token")
    parser.add_argument("--model", default="fake", help="the model name /v1/models reports")
    parser.add_argument("--impl", choices=("raw", "aiohttp"), default="raw")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this core")
    parser.add_argument("--steps", action="store_true", help="engine-like timing: every gap, every running stream's "
                        "next token leaves in one pass (raw impl only)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    with contextlib.suppress(KeyboardInterrupt):
        run_server(args.host, args.port, args.gap_ms, args.first_ms, args.model, args.impl, args.loop, args.steps)


if __name__ == "__main__":
    main()
