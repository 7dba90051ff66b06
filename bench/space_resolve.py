"""Does requirements.txt, the CUDA stack a Space installs, resolve, and to the versions it pins?

pip resolves the file with ``--dry-run --ignore-installed --report`` (nothing is installed, into this virtualenv or
anywhere), the way a Space's pip sees it: the index alone (PIP_INDEX_URL, default PyPI), with this machine's pip
configuration files, local wheel folders, extra indexes and constraint file set aside (``--machine-config`` keeps
them: here they offer a CPU torch that would win). The script reads pip's report and prints every pin of the file
beside the version that resolved, and torch beside the version the resolved vllm pins (requirements.txt leaves
torch to vllm); it exits 1 on a mismatch, or when pip finds no resolution. A Space installs on Linux x86_64 with
the front matter's ``python_version``: run it with that Python (it says so when the running one differs).

    python -m bench.space_resolve [--requirements requirements.txt] [--machine-config] [--report FILE]

It is no test: the index here serves no separate wheel metadata (PEP 658), so pip downloads each candidate's whole
wheel to read its dependencies, ~4.4 GB (vllm 327 MB, torch 527 MB, cuDNN 366 MB, ...), in 64-98 s on this
machine (docs/space.md, "A first start, rehearsed").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("vllm", "transformers", "gradio", "torch")  # torch: the version vllm pins
SETS_ASIDE = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")
UNITS = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def norm(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: Path) -> dict[str, str]:
    """Each ``name==version`` line of a requirements file, by normalized name."""
    found = {}
    for line in requirements.read_text().splitlines():
        if m := re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line):
            found[norm(m.group(1))] = m.group(2)
    return found


def resolved(report: dict) -> dict[str, dict]:
    """The report's distributions to install, by normalized name: their metadata."""
    return {norm(item["metadata"]["name"]): item["metadata"] for item in report["install"]}


def pinned_by(metadata: dict, package: str, environment: dict) -> str | None:
    """The version ``package==X`` that a distribution's metadata requires (no extra; markers evaluated in the
    report's environment), or None."""
    for line in metadata.get("requires_dist", []):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if norm(req.name) != package or (req.marker and not req.marker.evaluate({**environment, "extra": ""})):
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            return exact[0]
    return None


def compare(report: dict, wanted: dict[str, str]) -> tuple[list[tuple[str, str, str, bool]], bool]:
    """Rows (package, pinned, resolved, ok) for every pin and for torch (pinned: what vllm pins), and whether the
    checked packages all matched. A local label (torch's ``+cpu``) is left out of the comparison, not the row."""
    got = resolved(report)
    rows = []
    for name, pin in wanted.items():
        version = got.get(name, {}).get("version", "-")
        rows.append((name, pin, version, version == pin))
    if "vllm" in got:
        torch_pin = pinned_by(got["vllm"], "torch", report.get("environment", {})) or "-"
        version = got.get("torch", {}).get("version", "-")
        rows.append(("torch", f"{torch_pin} (vllm's)", version, version.split("+")[0] == torch_pin))
    checked = {row[0]: row[3] for row in rows}
    return rows, all(checked.get(name, False) for name in CHECKED) and all(row[3] for row in rows)


def pip_env(machine_config: bool) -> dict[str, str]:
    """pip's environment: this one, less the machine's configuration files and local sources (unless kept)."""
    env = dict(os.environ)
    if not machine_config:
        env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
        for key in SETS_ASIDE:
            env.pop(key, None)
    return env


def downloaded_mb(log: str) -> float:
    """What pip's verbose log says it downloaded, in MB."""
    return sum(float(n) * UNITS[u] for n, u in re.findall(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)", log))


def space_python() -> str | None:
    """The front matter's python_version (README.md), or None."""
    m = re.search(r'^python_version:\s*"?([\d.]+)"?', (ROOT / "README.md").read_text(), re.MULTILINE)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", type=Path, default=ROOT / "requirements.txt")
    parser.add_argument("--machine-config", action="store_true",
                        help="keep this machine's pip configuration (local wheels, extra indexes, constraints)")
    parser.add_argument("--report", type=Path, default=None, help="keep pip's report here (default: a temp file)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds pip may take")
    args = parser.parse_args(argv)

    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (space := space_python()) and space != running:
        print(f"note: this is Python {running}; the Space runs {space} (README.md's python_version)")
    with tempfile.TemporaryDirectory(prefix="space-resolve-") as tmp:
        report_path = args.report or Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-r", str(args.requirements), "--dry-run",
               "--ignore-installed", "--no-cache-dir", "--report", str(report_path), "-v"]
        began = time.monotonic()
        try:
            done = subprocess.run(cmd, env=pip_env(args.machine_config), capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"pip did not finish in {args.timeout:.0f} s")
            return 1
        took = time.monotonic() - began
        log = done.stdout + done.stderr
        if done.returncode != 0:
            print(f"pip found no resolution (exit {done.returncode}, {took:.0f} s):")
            print("\n".join(line for line in log.splitlines()[-40:] if "is ignored: it is neither" not in line))
            return 1
        report = json.loads(report_path.read_text())
    rows, ok = compare(report, pins(args.requirements))
    print(f"resolved {len(report['install'])} distributions in {took:.0f} s with pip {report.get('pip_version')} "
          f"(Python {report['environment']['python_full_version']}, {report['environment']['platform_machine']}; "
          f"~{downloaded_mb(log):,.0f} MB downloaded; "
          f"{'machine config kept' if args.machine_config else 'index only'})")
    width = max(len("package"), *(len(r[0]) for r in rows))
    print(f"{'package':<{width}}  {'pinned':<22}  resolved")
    for name, pin, version, match in rows:
        print(f"{name:<{width}}  {pin:<22}  {version:<16}  {'ok' if match else 'MISMATCH'}")
    missing = [name for name in CHECKED if name not in {row[0] for row in rows}]
    if missing:
        print(f"not in {args.requirements.name} or not resolved: {', '.join(missing)}")
    print("all pins resolved as pinned" if ok else f"MISMATCH: {args.requirements.name} does not resolve to its pins")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
