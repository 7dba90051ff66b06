"""Which settings make HF-CB fastest here? Its page size and capturing its CUDA graphs at start, side by side.

Each setting loads the lab's ``hf-cb`` engine in this process and runs the same seeded plan as ``python -m
lab bench --engines hf-cb`` with ``--repeats 2``: repeat 0 is the first level at each user count (after the
lab's two warm-up requests, and for the larger counts after the smaller ones), so it pays for the graphs
transformers captures as it goes at that size; repeat 1 runs warm. Settings run one after another
(each unloads its engine first) and the output tok/s of every setting, level and repeat is printed as one
table at the end; every setting's summary.json is kept under --out.

    python -m bench.hf_cb_settings --device cuda --model .gpu-pack/model --load-format dummy \\
        --pages 64,128,256 --users 20,64 --output-len 128

Settings are ``PAGE`` (graphs captured at start, the engine's default) and ``PAGE:lazy`` (captured while
requests run, as the engine did before it called transformers' warmup()); ``--pages 256,256:lazy`` compares the two.
The ``graphs`` column says what the engine reported: ``start``, ``lazy`` (as requests run: asked so, or a
transformers without warmup()), or ``none`` (no CUDA graphs, as on CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from lab.metrics import level_rates

log = logging.getLogger("hf_cb_settings")


def parse_settings(text: str) -> list[tuple[int, bool]]:
    """'64,256:lazy' -> [(64, True), (256, False)]: (page size, graphs captured at start)."""
    settings = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        page, _, mode = item.partition(":")
        if mode not in ("", "lazy") or not page.isdigit() or int(page) < 1:
            raise SystemExit(f"--pages: {item!r} is not PAGE or PAGE:lazy with PAGE a positive integer")
        settings.append((int(page), mode != "lazy"))
    return settings


def run_setting(page: int, at_start: bool, args: argparse.Namespace, out: Path) -> dict:
    """One setting through the lab's CLI in this process; returns its summary.json."""
    from lab import __main__ as cli
    from lab.engines import hf_cb

    hf_cb.PAGE_SIZE, hf_cb.WARM_UP_GRAPHS = page, at_start
    folder = out / f"page{page}-{'start' if at_start else 'lazy'}"
    argv = ["bench", "--engines", "hf-cb", "--users", args.users, "--output-len", str(args.output_len),
            "--requests-per-user", str(args.requests_per_user), "--repeats", "2", "--workload", args.workload,
            "--device", args.device, "--load-format", args.load_format, "--out", str(folder)]
    argv += ["--model", args.model] if args.model else []
    argv += ["--kv-cache-gib", str(args.kv_cache_gib)] if args.kv_cache_gib else []
    code = cli.main(argv)
    summary = folder / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else {"error": f"lab bench exited {code}"}


def table(results: dict[tuple[int, bool], dict]) -> str:
    lines = [f"{'page':>5} {'graphs':>8} {'users':>5} {'repeat 0 tok/s':>15} {'repeat 1 tok/s':>15} {'1 / 0':>6}"]
    for (page, _), summary in results.items():
        engine = summary.get("engine_args", {}).get("hf-cb", {})
        captured = "start" if engine.get("graphs_captured_at_start") else "lazy"
        mode = captured if engine.get("use_cuda_graph") else "none"
        if "runs" not in summary:
            lines.append(f"{page:>5} {mode:>8}   {summary.get('error', 'no result')}")
            continue
        for (_, users), by_repeat in sorted(level_rates(summary["runs"]).items(), key=lambda kv: kv[0][1]):
            first, second = by_repeat.get(0), by_repeat.get(1)
            ratio = f"{second / first:6.2f}" if first and second else "     -"
            lines.append(f"{page:>5} {mode:>8} {users:>5} {first or 0:>15.1f} {second or 0:>15.1f} {ratio}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="64,128,256,256:lazy")
    parser.add_argument("--users", default="20,64")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-user", type=int, default=1)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--out", default=None, help="keep each setting's results here (default: a temporary folder)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out or tempfile.mkdtemp(prefix="kvlab-hfcb-"))
    results = {}
    for page, at_start in parse_settings(args.pages):
        log.info("page size %d, graphs captured %s", page, "at start" if at_start else "as requests run")
        results[(page, at_start)] = run_setting(page, at_start, args, out)
        print(table({(page, at_start): results[(page, at_start)]}), flush=True)  # each as it ends: nothing lost
    print(f"\nHF-CB output tok/s, {args.workload}, {args.output_len} tokens, users {args.users} (results in {out}):")
    print(table(results))


if __name__ == "__main__":
    main()
