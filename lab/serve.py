"""OpenAI-compatible servers on the embedded model: vLLM's, and transformers' (``python -m lab serve``).

``start_server`` launches one in a child process bound to 127.0.0.1, waits until it answers, and returns
its URL and model name; ``stop`` ends it. vLLM's server gets the same engine args as the lab's in-process
vLLM (lab.engines.vllm.engine_kwargs; its two step caps written out, the same values `vllm serve` would pick
unless set), its dev endpoints on (so the lab can reset its prefix cache between runs) and its /metrics;
transformers' server (``transformers serve``) runs with its continuous batching (paged KV) and has no /metrics.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lab.config import EngineConfig

log = logging.getLogger(__name__)
SERVER_ENGINES = ("vllm", "hf")
READY_TIMEOUT_S = 600.0  # a first vLLM start on 2 CPU cores takes about a minute
STOP_TIMEOUT_S = 5.0
HOST = "127.0.0.1"


@dataclass
class Server:
    """A running server: where it answers and what it serves."""

    engine: str
    url: str
    model: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server wrote (why it failed to start, say)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def vllm_command(config: EngineConfig, model_path: str, port: int) -> list[str]:
    """vLLM's OpenAI server with the lab's engine args, as a command line."""
    from lab.engines.vllm import engine_kwargs

    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", HOST, "--port", str(port),
            "--enable-prompt-tokens-details"]  # each answer's usage says its prefix-cache hits (the chat workload)
    for key, value in engine_kwargs(config, model_path).items():
        flag = "--" + key.replace("_", "-")
        if key == "disable_log_stats":
            continue  # stats stay on: they feed /metrics
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, str(value)]
    return args


def hf_command(config: EngineConfig, model_path: str, port: int) -> list[str]:
    """transformers' server with continuous batching and the in-process HF-CB's pool (its blocks, pages, tokens per
    step), as a command line. Left to size its pool itself on CPU it took 90% of free memory (19.7 GB here)."""
    from lab.engines.hf_cb import BATCH_TOKENS, PAGE_SIZE, pool_blocks
    from lab.memory import model_kv_bytes_per_token

    per_token = model_kv_bytes_per_token(model_path, config.resolved_dtype())
    blocks = pool_blocks(config, per_token) if per_token else None
    pool = ["--cb-block-size", str(PAGE_SIZE), "--cb-max-batch-tokens", str(BATCH_TOKENS)] + (
        ["--cb-num-blocks", str(blocks)] if blocks else [])
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", model_path, "--host", HOST,
            "--port", str(port), "--device", config.resolved_device(), "--dtype", config.resolved_dtype(),
            "--continuous-batching", *pool]


def server_env(engine: str, config: EngineConfig, api_key: str | None = None) -> dict:
    """The child's environment: vLLM's dev endpoints, its API key if any, the lab's CPU attention choice."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", PYTHONUNBUFFERED="1")
    env.pop("VLLM_API_KEY", None)
    if api_key and engine == "vllm":
        env["VLLM_API_KEY"] = api_key  # vLLM's server then answers only requests that carry it
    if engine == "vllm":
        from lab.engines import vllm_plugin
        from lab.engines.vllm import one_thread_env

        for key, value in one_thread_env(config).items():
            env.setdefault(key, value)

        isa = config.vllm_cpu_attention_isa()
        if isa is not None and vllm_plugin.installed():
            env[vllm_plugin.ENV] = isa
    return env


def start_server(engine: str, config: EngineConfig, model_path: str, port: int = 0,
                 ready_timeout_s: float = READY_TIMEOUT_S, api_key: str | None = None) -> Server:
    """Start a server and wait until its /v1/completions can be reached.

    Args:
        engine: 'vllm' or 'hf'.
        config: Engine settings (vLLM's KV budget, block size, dtype, device).
        model_path: The resolved model folder.
        port: TCP port; 0 picks a free one.
        ready_timeout_s: Longest wait for it to answer.
        api_key: vLLM only: the key its clients must send (transformers serve has none).

    Returns:
        The running server.

    Raises:
        ValueError: an unknown engine. RuntimeError: it exited or did not answer in time (its log tail).
    """
    if engine not in SERVER_ENGINES:
        raise ValueError(f"serve: engine must be one of {', '.join(SERVER_ENGINES)}, not {engine!r}")
    if api_key and engine != "vllm":
        raise ValueError("serve: an API key needs --engine vllm (transformers serve checks no key)")
    port = port or free_port()
    command = (vllm_command if engine == "vllm" else hf_command)(config, model_path, port)
    log_path = Path(tempfile.mkstemp(prefix=f"kvlab-serve-{engine}-", suffix=".log")[1])
    with open(log_path, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=server_env(engine, config, api_key))
    server = Server(engine, f"http://{HOST}:{port}", model_path, process, log_path)
    log.info("starting %s server at %s (log %s)", engine, server.url, log_path)
    try:
        wait_ready(server, ready_timeout_s)
    except BaseException:  # it exited, never answered, or Ctrl-C came: leave none of its processes behind
        stop(server)
        raise
    return server


def wait_ready(server: Server, timeout_s: float) -> None:
    """Poll /health until it answers 200; raise with the log's tail if the server exits or never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the {server.engine} server exited ({server.process.returncode}) while starting:\n"
                               f"{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the {server.engine} server did not answer within {timeout_s:g} s:\n{server.log_tail()}")


def stop(server: Server, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """End the server and every process it started (its own process group): SIGTERM, then SIGKILL."""
    kill(server, signal.SIGTERM)
    try:
        server.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    kill(server, signal.SIGKILL)  # what is left of the group (vLLM's engine core, say)
    server.process.wait()


def kill(server: Server, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the server's whole process group (a test kills a server mid-run this way)."""
    try:
        os.killpg(server.process.pid, sig)
    except ProcessLookupError:
        pass
