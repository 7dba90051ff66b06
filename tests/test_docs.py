"""The docs stay true to the results and to each other: README is short and quotes only figures of the benchmarks'
summary table, that table is what bench.summary makes from the result files, and every relative link leads to a
file (and a heading) that exists. Fast: no engine, no model."""

import re
from pathlib import Path

import pytest

from bench import summary

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250  # a newcomer's page: reference material lives in docs/
UNITS = r"(?:x|tok/s|req/s|ms|s|min|h|GiB|MiB|KiB|GB|%|nats?)"
# a figure: '12.65x', '1,026 tok/s', '1.45-1.49x' (not '1280x720', 'SmolLM2-135M', '5 users')
FIGURE = re.compile(rf"(?<![\w.,-])\d[\d,.]*(?:-\d[\d,.]*)?\s?{UNITS}(?![\w/])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "results").glob("*/README.md"))]


def figures(text: str) -> list[str]:
    """Every number with a unit or an 'x' ratio in ``text`` (a range counts as one figure)."""
    return [m.group(0) for m in FIGURE.finditer(text)]


def summary_table() -> str:
    return summary.current((ROOT / summary.PAGE).read_text())


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def test_figures_are_found_as_written():
    text = "made 12.65x, 1,026 tok/s and 1.45-1.49x; 0.34 ms; 1280x720 screens, SmolLM2-135M, 5 users, 60-90 minutes"
    assert figures(text) == ["12.65x", "1,026 tok/s", "1.45-1.49x", "0.34 ms"]


def test_every_figure_readme_quotes_is_in_the_summary_table():
    quoted = figures(README.read_text())
    assert quoted, "README quotes no figure: the check would prove nothing"
    table = summary_table()
    missing = [f for f in quoted if f not in table]
    assert not missing, f"README quotes figures the summary table of docs/benchmarks.md lacks: {missing}"


def test_the_summary_table_is_what_the_result_files_give():
    assert summary.check() == [], "run python -m bench.summary"
    assert summary.main(["--check"]) == 0


def test_summary_reads_json_paths_and_finds_text(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text('{"ratio": {"5": 2.3834}, "runs": [{"tok_s": 1026.4}], '
                                     '"started_at": "2026-11-26T03:32:45+00:00"}')
    (tmp_path / "r.txt").write_text("engine / offline: 1.031 [0.962-1.105]\n")
    monkeypatch.setattr(summary, "ROOT", tmp_path)
    assert summary.figure({"file": "r.json", "path": ["ratio", "5"], "format": "{:.2f}x"}) == "2.38x"
    assert summary.figure({"file": "r.json", "path": ["runs", 0, "tok_s"], "format": "{:,.0f} tok/s"}) == "1,026 tok/s"
    assert summary.figure({"file": "r.txt", "text": "1.031", "near": "offline: 1.031"}) == "1.031"
    assert summary.date({"file": "r.json", "path": ["started_at"]}) == "2026-11-26"
    with pytest.raises(ValueError, match="not in the file"):
        summary.figure({"file": "r.txt", "text": "1.04"})
    with pytest.raises(ValueError, match="no"):
        summary.figure({"file": "r.json", "path": ["ratio", "20"], "format": "{}"})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in LINK.findall(CODE_SPAN.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in summary.anchors(file.read_text()):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_readmes_docs_index_names_every_docs_page():
    """README's Docs list links every page in docs/ (and the results folder), each on a line of its own."""
    index = README.read_text().split("\n## Docs\n", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("](", 1)[1].split(")", 1)[0] for line in index.splitlines() if line.startswith("- [")}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"docs/results/"}
    assert pages <= listed, f"README's Docs list lacks {sorted(pages - listed)}"
