"""What does watching cost? Output tok/s of the same run with the dashboard open vs from the CLI.

1. Starts app.py (the engines given, with the engine options given) and, once it is ready, runs the plan
   through the app's API with no page open (``app, no page``: the same processes, Gradio serving nothing).
2. Opens the page in headless Chromium, whose timer redraws the live plots once a second, and runs the
   same plan again (``page open``).
3. Runs the same plan with ``python -m lab bench`` and the same engine options (no UI; a process of its own,
   started for the side, beside the app, whose engines then sit idle).
All on this machine, printed side by side as ratios per engine and user level; each level runs --repeats
times on each side. --rounds N runs the three sides N times, each round's order turned by one (over three
rounds each side runs first, second and last once): a lent GPU machine's speed drifts within minutes, and
turning the order keeps that drift out of the ratios. The CPU seconds of the app's sides are printed too, for
the app's page process and for its engine host process (lab.app.host_process, the interpreter that drives the
engines), and for the browser: what the page costs each.
In use the browser runs on the learner's machine, not beside the engines; --page-cpus N gives the page's
process, this bench and the browser the last N CPUs and the engines (and the CLI) the others, so that the
browser's rendering does not take the engines' cores.
Usage: python -m bench.dashboard_overhead [--users 1,5,10] [--requests-per-user 2] [--output-len 32]
       [--repeats 3] [--rounds 1] [--page-cpus 0] [--engines vllm] [--chromium PATH] [--out DIR]
       [engine options of lab bench]
       python -m bench.dashboard_overhead --pool DIR [DIR ...]   (earlier runs' --out folders, as one table)
The table gives each side's tok/s over all repeats, then each pair of sides compared round by round (the
ratio of their means in each round: the geometric mean over the rounds, with a 95% t-interval shown from 4 rounds on):
the interval says how sharp it is (sharper than either side's spread only where a round's sides drift
together). Each round's CLI files and log are kept in the --out folder (cli-round-N/).
e.g. on a GPU: --device cuda --model .gpu-pack/model --load-format dummy --kv-cache-gib 8 --users 20,64
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.paired import MIN_ROUNDS, interval_text, rotated
from lab.metrics import Spread, tok_s_spreads
from lab.options import add_engine_args

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SIDES = ("no_page", "page", "cli")
PAIRS = (("page", "cli"), ("no_page", "cli"), ("page", "no_page"))
READY_JS = ("(() => { const e = document.querySelector('#load-status'); "
            "return e && e.textContent.includes('ready'); })()")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine options that differ from their defaults, as argv for app.py and ``lab bench`` alike."""
    defaults = argparse.ArgumentParser()
    add_engine_args(defaults)
    argv = []
    for action in defaults._actions:
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._HelpAction) or value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, list):
            argv += [part for item in value for part in (flag, str(item))]
        else:
            argv += [flag, str(value)]
    return argv


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_pid(app_pid: int) -> int:
    """The app's engine host process (a child running lab.app.host_process)."""
    import psutil

    return next(p.pid for p in psutil.Process(app_pid).children() if "lab.app.host_process" in p.cmdline())


def browser_cpu_seconds(app_pid: int) -> float:
    """CPU seconds of this process's children outside the app (Playwright's driver and the browser)."""
    import psutil

    app = psutil.Process(app_pid)
    skip = {app_pid} | {p.pid for p in app.children(recursive=True)}
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        if p.pid not in skip:
            with contextlib.suppress(psutil.Error):
                total += sum(p.cpu_times()[:2])
    return total


def cpu_split(count: int) -> tuple[set[int], set[int]]:
    """This machine's CPUs as (the engines', the page's): the page gets the last ``count`` (0: all share)."""
    cpus = sorted(os.sched_getaffinity(0))
    return (set(cpus[:-count]), set(cpus[-count:])) if count else (set(cpus), set(cpus))


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Move every thread of a process onto ``cpus`` (its later threads inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def serving_app(args):
    """app.py with the engines and options given, once ready: yields its url, an API client and CPU meters."""
    port = free_port()
    log = open(Path(args.out) / "app.log", "w")
    engines_cpus, page_cpus = args.cpus
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--engines", args.engines,
                            *engine_argv(args)], stdout=log, stderr=subprocess.STDOUT,
                           preexec_fn=lambda: os.sched_setaffinity(0, engines_cpus))  # its host and vLLM inherit it
    os.sched_setaffinity(0, page_cpus)  # this bench, Playwright's driver and the browser
    try:
        url = f"http://127.0.0.1:{port}/"
        client = _client_when_ready(url, app, args)
        pin_threads(app.pid, page_cpus)  # the page's process (the host process keeps the engines' CPUs)
        host = host_pid(app.pid)
        yield url, client, {"page": lambda: cpu_seconds(app.pid), "host": lambda: cpu_seconds(host),
                            "browser": lambda: browser_cpu_seconds(app.pid)}
    finally:
        app.terminate()
        app.wait(60)


def side_order(round_: int) -> tuple[str, ...]:
    """The sides of round ``round_``, turned by one each round: a drifting machine favours no side."""
    return tuple(rotated(list(SIDES), round_))


def measure(args) -> dict:
    """Every side, --rounds times; each side's summaries pooled, written after each (a cut run keeps them)."""
    found = {}
    with serving_app(args) as (url, client, meters):
        for round_ in range(args.rounds):
            for side in side_order(round_):
                _pool(found, side, in_round(run_side(side, url, client, meters, args, round_), round_))
                _kept(found, args)
    return found


def in_round(summary: dict, round_: int) -> dict:
    """The summary with each level tagged by the round it ran in (the paired ratios compare within a round)."""
    return {**summary, "runs": [{**run, "round": round_} for run in summary["runs"]]}


def pooled(folders: list[str]) -> dict:
    """The summaries.json of several runs of this bench as one, their rounds numbered on (a run from before
    rounds were recorded pools its tok/s, but the paired block leaves it out)."""
    found, first = {}, 0
    for folder in folders:
        saved = json.loads(_summaries_text(Path(folder)))
        for side, summary in saved.items():
            runs = [{**run, "round": first + run["round"]} if "round" in run else run for run in summary["runs"]]
            _pool(found, side, {**summary, "runs": runs})
        first += 1 + max((run["round"] for summary in saved.values() for run in summary["runs"] if "round" in run),
                         default=-1)
    return found


def _summaries_text(folder: Path) -> str:
    """A run's summaries.json, or its gzipped copy as docs/results keep it."""
    if (folder / "summaries.json").is_file():
        return (folder / "summaries.json").read_text()
    if (folder / "summaries.json.gz").is_file():
        return gzip.decompress((folder / "summaries.json.gz").read_bytes()).decode()
    raise SystemExit(f"--pool: no summaries.json(.gz) in {folder} (give the --out folders of this bench's runs)")


def run_side(side: str, url: str, client, meters: dict, args, round_: int) -> dict:
    """One side's run of the plan: its summary (the app's sides with their processes' CPU seconds)."""
    if side == "cli":
        return cli_run(args, Path(args.out) / f"cli-round-{round_}")
    if side == "no_page":
        return _timed_run(client, meters, args)
    with _page_open(url, args):
        return _timed_run(client, meters, args)


def _client_when_ready(url: str, app: subprocess.Popen, args):
    """A gradio_client Client once the app answers and its engines are loaded (one warm-up run)."""
    from gradio_client import Client

    deadline = time.monotonic() + args.ready_timeout_s
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise RuntimeError(f"app.py exited ({app.returncode}): see {args.out}/app.log")
        try:
            client = Client(url, verbose=False)
            reply = json.loads(client.predict(args.engines, "1", args.workload, 8, 1, 1, api_name="/run_and_wait"))
        except Exception:  # noqa: BLE001 - the server is still starting
            time.sleep(1)
            continue
        if not reply.get("error"):  # a summary (its own "error" is empty) rather than a refusal
            return client
        if "failed" in reply["error"]:
            raise RuntimeError(f"the app could not load its engines: {reply['error']}")
        time.sleep(1)
    raise TimeoutError(f"the app was not ready within {args.ready_timeout_s} s")


def _timed_run(client, meters: dict, args) -> dict:
    """The plan through /run_and_wait; its summary, with each meter's CPU seconds over it and the wall time."""
    cpu, began = {name: meter() for name, meter in meters.items()}, time.monotonic()
    summary = json.loads(client.predict(args.engines, args.users, args.workload, args.output_len,
                                        args.requests_per_user, args.repeats, api_name="/run_and_wait"))
    if summary.get("error"):
        raise RuntimeError(summary["error"])
    for name, meter in meters.items():
        summary[f"{name}_cpu_s"] = meter() - cpu[name]
    summary["wall_s"] = time.monotonic() - began
    return summary


def _pool(found: dict, side: str, summary: dict) -> None:
    """Add one round of a side: its levels beside the earlier rounds', its CPU and wall seconds summed."""
    if side not in found:
        found[side] = summary
        return
    later = 1 + max(run["repeat"] for run in found[side]["runs"])  # a round's repeats follow the earlier ones'
    found[side]["runs"] += [{**run, "repeat": later + run["repeat"]} for run in summary["runs"]]
    for key in ("page_cpu_s", "host_cpu_s", "browser_cpu_s", "wall_s"):
        if key in summary:  # the CLI's side has no app processes to meter (nor older runs a browser)
            found[side][key] = found[side].get(key, 0) + summary[key]


class _page_open:
    """The dashboard open in headless Chromium (its timer ticking) for the duration of a ``with``."""

    def __init__(self, url: str, args):
        self.url, self.args = url, args

    def __enter__(self):
        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(executable_path=self.args.chromium,
                                                       args=CHROMIUM_ARGS + self.args.chromium_arg)
        page = self.browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(self.url)
        page.wait_for_function(READY_JS, timeout=60_000)
        return page

    def __exit__(self, *exc) -> None:
        self.browser.close()
        self.playwright.stop()


def cli_run(args, out: Path) -> dict:
    """Step 3: the same plan through ``python -m lab bench`` with the same engine options (its files and log
    in ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cli.log", "w") as log:
        engines_cpus, _ = args.cpus
        lengths = ["--output-len", str(args.output_len)] if args.output_len else []  # 0: the workload's own
        subprocess.run([sys.executable, "-m", "lab", "bench", "--engines", args.engines, "--users", args.users,
                        "--workload", args.workload, *lengths, "--requests-per-user", str(args.requests_per_user),
                        "--repeats", str(args.repeats),
                        "--out", str(out), *engine_argv(args)], check=True, stdout=log, stderr=subprocess.STDOUT,
                       preexec_fn=lambda: os.sched_setaffinity(0, engines_cpus))
    return json.loads((out / "summary.json").read_text())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,5,10")
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=32, help="0: the workload's own lengths")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the three sides this many times, their order turned each round")
    parser.add_argument("--engines", default="vllm", help="loaded and measured on every side (comma list)")
    parser.add_argument("--page-cpus", type=int, default=0,
                        help="keep the last N CPUs for the page (the app's page process, this bench and the "
                             "browser) and the others for the engines and the CLI; 0: all share")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser Playwright launches")
    parser.add_argument("--chromium-arg", action="append", default=[], help="one more browser flag (repeat)")
    parser.add_argument("--ready-timeout-s", type=float, default=900)
    parser.add_argument("--pool", nargs="+", metavar="DIR", help="measure nothing: print the table of these "
                        "earlier runs' summaries.json pooled (their --out folders)")
    parser.add_argument("--out", default=None, help="folder for the summaries, logs and table (default: a temp dir)")
    add_engine_args(parser)
    args = parser.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="kvlab-dashboard-bench-")
    args.cpus = cpu_split(args.page_cpus)  # before this process moves onto the page's CPUs
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    found = pooled(args.pool) if args.pool else measure(args)
    table = ratio_table(found)
    (Path(args.out) / "table.txt").write_text(table + "\n")
    print(table)


def _kept(found: dict, args) -> None:
    """Write what is measured so far (a run cut short keeps its sides) and say each side's tok/s."""
    (Path(args.out) / "summaries.json").write_text(json.dumps(found, default=str))
    for side, summary in found.items():
        means = {key: round(s.mean, 1) for key, s in sorted(tok_s_spreads(summary["runs"]).items())}
        print(f"{side}: output tok/s {means}", flush=True)


def ratio_table(found: dict) -> str:
    """One row per engine and user level: each side's output tok/s and the ratios, then the ratios paired by
    round, and the CPU seconds of the app's processes."""
    spreads = {side: tok_s_spreads(found.get(side, {}).get("runs", [])) for side in SIDES}
    lines = [f"{'engine':>8} {'users':>5} {'app, no page':>22} {'page open':>22} {'CLI':>22} "
             f"{'page/CLI':>9} {'page/no page':>12}   (output tok/s: mean [min-max] over all repeats, n each)"]
    for key in sorted(spreads["cli"]):
        row = [spreads[side].get(key) for side in SIDES]
        if None in row:
            continue
        no_page, page, cli = row
        lines.append(f"{key[0]:>8} {key[1]:>5} {_spread(no_page):>22} {_spread(page):>22} {_spread(cli):>22} "
                     f"{page.mean / cli.mean:>9.3f} {page.mean / no_page.mean:>12.3f}   n {cli.n}")
    lines.append(f"{'paired':>8} {'users':>5} " + " ".join(f"{f'{top}/{base}':>22}" for top, base in PAIRS)
                 + f"   (each round's ratio of means: geometric mean over the rounds [95% t-interval, "
                 f"shown from {MIN_ROUNDS} rounds on], n rounds)")
    for key, ratios in sorted(paired_ratios(found).items()):
        lines.append(f"{key[0]:>8} {key[1]:>5} " + " ".join(f"{interval_text(ratios[pair]):>22}" for pair in PAIRS)
                     + f"   n {len(ratios[PAIRS[0]])}")
    meters = [side for side in SIDES[:2] if side in found]
    lines.append("CPU s of the app's page process / engine host process / browser (wall s): " + ", ".join(
        f"{side} {found[side].get('page_cpu_s', 0):.1f} / {found[side].get('host_cpu_s', 0):.1f} / "
        f"{found[side].get('browser_cpu_s', 0):.1f} ({found[side].get('wall_s', 0):.1f})" for side in meters))
    return "\n".join(lines)


def paired_ratios(found: dict) -> dict[tuple[str, int], dict[tuple[str, str], list[float]]]:
    """Per level, each pair of sides compared within each round (the sides of a round ran minutes apart):
    the ratio of the two sides' mean tok/s in each round. Levels from runs that predate rounds are left out."""
    rates = {side: round_rates(found.get(side, {}).get("runs", [])) for side in SIDES}
    out = {}
    for key in rates["cli"]:
        pairs = {pair: _round_ratios(rates, key, *pair) for pair in PAIRS}
        if all(pairs.values()):
            out[key] = pairs
    return out


def _round_ratios(rates: dict, key: tuple[str, int], top: str, base: str) -> list[float]:
    tops, bases = rates[top].get(key, {}), rates[base].get(key, {})
    return [tops[r] / bases[r] for r in sorted(tops.keys() & bases.keys())]


def round_rates(runs: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """Mean output tok/s of each level in each round."""
    by_round: dict[tuple[str, int], dict[int, list[float]]] = {}
    for run in (run for run in runs if "round" in run):
        by_round.setdefault((run["engine"], run["users"]), {}).setdefault(run["round"], []).append(run["output_tok_s"])
    return {key: {r: sum(v) / len(v) for r, v in rounds.items()} for key, rounds in by_round.items()}


def _spread(found: Spread) -> str:
    return f"{found.mean:.1f} [{found.low:.1f}-{found.high:.1f}]"


if __name__ == "__main__":
    main()
