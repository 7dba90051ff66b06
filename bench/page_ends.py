"""Does every page show each run's end? Rounds of a cancelled run watched by two Chromium pages, on a loaded CPU.

Serves the app as the browser tests do (tests/ui_kit.serve_lab: a RemoteHost, the real engines on the CPU) and
drives it with their page helpers. It starts --busy spinning processes, then for each round: one page starts a run
(4 users, 64 tokens, 5 requests each), a second page opens while it goes and cancels it once a request has
finished, and each page has --wait-s to show `cancelled` on its progress line. A page that does not is counted
with what it still showed. A page line that stops redrawing is rare (at 3b8350a, once in about 20 rounds with
three busy loops on a 2-core EPYC: docs/results/cpu-epyc-2core), so a verdict needs many rounds. Exits 1 when
any page missed an end.

Usage: python -m bench.page_ends [--rounds 70] [--busy 3] [--wait-s 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_round(browser, host, url: str, wait_s: float) -> list[str]:
    """One cancelled run, as tests/test_ui.py's second-browser test does it; what each page that missed its end
    still showed."""
    from tests.ui_kit import open_ready, submit, wait_text

    first = open_ready(browser, url)
    submit(first, "4", 64, 5)
    second = open_ready(browser, url)
    wait_text(second, "#progress", "Running", 60)
    while not any(r.status == "ok" for level in host.last("run").levels for r in level.records):
        time.sleep(0.2)
    second.click("#cancel")
    host.wait_task(60)
    missed = []
    for page in (first, second):
        try:
            wait_text(page, "#progress", "cancelled", wait_s)
        except AssertionError:
            missed.append(page.inner_text("#progress"))
        page.close()
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=70)
    parser.add_argument("--busy", type=int, default=3, help="spinning processes beside the app")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long a page has to show the end")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from lab.app.access import Access
    from tests.ui_kit import CHROMIUM, CHROMIUM_ARGS, serve_lab

    host, app, url = serve_lab(Path(tempfile.mkdtemp(prefix="page-ends-")) / "results.sqlite",
                               Access.for_app("127.0.0.1", environ={}))
    if not host.wait_ready(timeout_s=300):
        app.close()
        host.close()
        sys.exit(f"the engines did not load: {host.status.text()}")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    misses = 0
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for number in range(1, args.rounds + 1):
                missed = one_round(browser, host, url, args.wait_s)
                misses += len(missed)
                print(f"round {number}/{args.rounds}: {'every page showed the end' if not missed else missed}; "
                      f"{misses} missed so far", flush=True)
    finally:
        for process in busy:
            process.kill()
        app.close()
        host.close()
    print(f"{misses} of {2 * args.rounds} pages missed a run's end ({args.rounds} rounds, {args.busy} busy loops)")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
