"""What does watching cost? vLLM tok/s of one short run with the dashboard open vs from the CLI.

1. Starts app.py (both engines loaded, as in the demo) and opens the page in headless Chromium, whose
   timer redraws every plot once a second while the run goes; the run is started through the app's API.
2. Stops the app, then runs the same plan with ``python -m lab bench`` (no UI at all).
Both on this machine, one after the other, printed side by side as a ratio per user level.
Each level runs --repeats times on each side; the table gives the mean and the range over the repeats.
Usage: python -m bench.dashboard_overhead [--users 1,5,10] [--requests-per-user 2] [--output-len 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.metrics import tok_s_spreads

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard_run(args) -> dict:
    """The run through the app, with its page open in a browser; returns summary.json."""
    from gradio_client import Client
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = open(Path(tempfile.gettempdir()) / "kvlab-dashboard-bench.log", "w")
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = None
            for _ in range(600):
                try:
                    page = page or browser.new_page()
                    page.goto(url)
                    break
                except Exception:  # noqa: BLE001 - the server is still starting
                    time.sleep(0.5)
            page.wait_for_function(
                "(() => { const e = document.querySelector('#load-status'); "
                "return e && e.innerText.includes('ready'); })()",
                timeout=600_000)
            client = Client(url, verbose=False)
            summary = json.loads(client.predict("vllm", args.users, args.workload, args.output_len,
                                                args.requests_per_user, args.repeats, api_name="/run_and_wait"))
            browser.close()
        return summary
    finally:
        app.terminate()
        app.wait(60)


def cli_run(args) -> dict:
    out = Path(tempfile.mkdtemp(prefix="kvlab-cli-bench-"))
    subprocess.run([sys.executable, "-m", "lab", "bench", "--engines", "vllm", "--users", args.users,
                    "--workload", args.workload, "--output-len", str(args.output_len),
                    "--requests-per-user", str(args.requests_per_user), "--repeats", str(args.repeats),
                    "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,5,10")
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dashboard = dashboard_run(args)
    time.sleep(3)
    cli = cli_run(args)
    tok = {name: {users: found for (engine, users), found in tok_s_spreads(s["runs"]).items() if engine == "vllm"}
           for name, s in (("dashboard", dashboard), ("cli", cli))}
    print(f"{'users':>5} {'dashboard open':>22} {'CLI':>22} {'dashboard/CLI':>14}   "
          f"(vLLM output tok/s: mean [min-max] of {args.repeats} repeats)")
    for users in sorted(tok["cli"]):
        d, c = tok["dashboard"][users], tok["cli"][users]
        print(f"{users:>5} {_spread(d):>22} {_spread(c):>22} {d.mean / c.mean:>14.2f}")


def _spread(found) -> str:
    return f"{found.mean:.1f} [{found.low:.1f}-{found.high:.1f}]"


if __name__ == "__main__":
    main()
