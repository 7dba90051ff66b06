"""Does every page show each run's end? Rounds of a cancelled run watched by two Chromium pages, on a loaded CPU.

Serves the app as the browser tests do (a RemoteHost, the real engines on the CPU), starts --busy spinning
processes, then for each round: one page starts a run (4 users, 64 tokens, 5 requests each), a second page opens
while it goes and cancels it once a request has finished, and each page has --wait-s to show `cancelled` on its
progress line. A page that does not is counted with what it still showed. A page line that stops redrawing is rare
(at 3b8350a, once in about 20 rounds with three busy loops on a 2-core EPYC: docs/results/cpu-epyc-2core), so a
verdict needs many rounds. Exits 1 when any page missed an end.

Usage: python -m bench.page_ends [--rounds 70] [--busy 3] [--wait-s 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
SHOWS = "([sel, text]) => document.querySelector(sel)?.innerText.includes(text)"


def serve():
    """The app on a free port with its engines ready: (host, app, url)."""
    from lab.app.access import Access
    from lab.app.host_process import RemoteHost
    from lab.app.ui import build_app
    from lab.config import EngineConfig
    from lab.serve import free_port

    host = RemoteHost(EngineConfig(device="cpu", max_model_len=1024),
                      db_path=Path(tempfile.mkdtemp(prefix="page-ends-")) / "results.sqlite")
    host.start_loading()
    app = build_app(host, Access.for_app("127.0.0.1", environ={}))
    port = free_port()
    app.queue(default_concurrency_limit=8).launch(server_name="127.0.0.1", server_port=port,
                                                  prevent_thread_lock=True, quiet=True)
    if not host.wait_ready(timeout_s=300):
        sys.exit(f"the engines did not load: {host.status.text()}")
    return host, app, f"http://127.0.0.1:{port}/"


def shows(page, selector: str, text: str, timeout_s: float) -> bool:
    try:
        page.wait_for_function(SHOWS, arg=[selector, text], timeout=timeout_s * 1000)
        return True
    except Exception:  # noqa: BLE001 - Playwright's time-out: the page did not show it
        return False


def open_page(browser, url: str):
    page = browser.new_page()
    page.goto(url)
    if not shows(page, "#load-status", "Engines ready", 60):
        raise RuntimeError("a new page did not say the engines are ready in 60 s")
    page.wait_for_selector("#run:enabled, #cancel:enabled", timeout=30_000)
    return page


def one_round(browser, host, url: str, wait_s: float) -> list[str]:
    """One cancelled run; what each page that missed its end still showed."""
    first = open_page(browser, url)
    for selector, value in (("#users textarea", "4"), ("#output-len input", "64"), ("#amount input", "5")):
        first.fill(selector, value)
    first.click("#run")
    second = open_page(browser, url)
    shows(second, "#progress", "Running", 60)
    while not any(r.status == "ok" for level in host.last("run").levels for r in level.records):
        time.sleep(0.2)
    second.click("#cancel")
    host.wait_task(60)
    missed = [page.inner_text("#progress") for page in (first, second) if not shows(page, "#progress", "cancelled",
                                                                                     wait_s)]
    first.close()
    second.close()
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=70)
    parser.add_argument("--busy", type=int, default=3, help="spinning processes beside the app")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long a page has to show the end")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    host, app, url = serve()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    misses = 0
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
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
