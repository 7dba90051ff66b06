"""The repository is a Hugging Face Space: README.md's front matter, read with huggingface_hub's card tools, names
an app file that exists and the gradio version requirements.txt pins (a Space installs gradio from sdk_version)."""

import re
from pathlib import Path

from huggingface_hub import RepoCard, SpaceHardware

ROOT = Path(__file__).resolve().parents[1]


def pinned(requirements: Path, package: str) -> str | None:
    """The version ``package==X`` pins in a requirements file (None when it is not pinned)."""
    found = re.search(rf"^{re.escape(package)}==([^\s#]+)", requirements.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def test_the_front_matter_is_a_space_card_that_matches_the_repository():
    import gradio

    card = RepoCard.load(ROOT / "README.md", repo_type="space")
    meta = card.data.to_dict()
    assert (ROOT / "README.md").read_text().startswith("---\n")
    assert meta["sdk"] == "gradio" and (ROOT / meta["app_file"]).is_file()
    assert meta["sdk_version"] == pinned(ROOT / "requirements.txt", "gradio") == gradio.__version__
    assert pinned(ROOT / "requirements-cpu.txt", "gradio") in (None, meta["sdk_version"])
    assert meta["title"] and meta["emoji"] and 0 < len(meta["short_description"]) <= 60
    assert re.fullmatch(r"3\.\d+", str(meta["python_version"]))
    assert meta["suggested_hardware"] in {h.value for h in SpaceHardware}
    assert not meta["suggested_hardware"].startswith(("cpu", "zero")), "vLLM needs a dedicated GPU"


def test_the_presenters_link_names_the_spaces_own_address_on_a_space(monkeypatch):
    from app import page_address, parse_args

    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SPACE_HOST", raising=False)
    assert page_address(parse_args(["--host", "0.0.0.0", "--port", "8000"])) == "http://127.0.0.1:8000"
    monkeypatch.setenv("SPACE_HOST", "someone-kv-lab.hf.space")
    assert page_address(parse_args([])) == "https://someone-kv-lab.hf.space"
