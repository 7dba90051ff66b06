"""The engine options every command line shares (the CLI, app.py, bench/): one flag per EngineConfig field.

Flags are grouped under the engine that reads them, as the engine registry declares (an option two engines
read sits in the first one's group). ``--engines`` lists what the registry holds at the moment the parser is
built, so a registered engine shows up in every help text.
"""

from __future__ import annotations

import argparse
import os

from lab.config import API_KEY_ENV, CPU_ATTENTION, DTYPES, MODEL_IMPLS, EngineConfig, decimal, parse_endpoint, whole
from lab.engines import registry


def whole_arg(text: str) -> int:
    """argparse's type for whole-number options: lab.config's rule (the page's too), so '1.5', '' and '１' are
    refused by name (exit 2) instead of rounded or read as another script's digits."""
    try:
        return whole(text, "option")
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a whole number, not {text!r}") from None


def number_arg(text: str) -> float:
    """argparse's type for decimal options: lab.config's rule ('nan', 'inf' and text refused by name, exit 2)."""
    try:
        return decimal(text, "option")
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a finite number, not {text!r}") from None


# EngineConfig field -> its flag's argparse keywords (the default is the field's own)
FLAGS = {
    "gpu_memory_utilization": dict(type=number_arg, help="vLLM's share of the GPU's TOTAL memory (not of free memory)"),
    "kv_cache_gib": dict(type=number_arg, help="KV budget in GiB (CPU default 0.25, 0.5 in float32; GPU default: "
                         "a pool that holds the Workshop demo's top level)"),
    "block_size": dict(type=whole_arg, help="vLLM KV block size in tokens"),
    "max_num_seqs": dict(type=whole_arg, help="most requests vLLM runs at once (default: vllm serve's on this "
                         "device, asked of vLLM)"),
    "max_num_batched_tokens": dict(type=whole_arg, help="most tokens vLLM computes in one step, prefill chunks and "
                                   "decodes together (default: vllm serve's on this device, asked of vLLM)"),
    "enforce_eager": dict(action="store_true", default=None,
                          help="vLLM without CUDA graphs / compile (always on for CPU)"),
    "model_impl": dict(choices=MODEL_IMPLS, help="vLLM's model code: auto, vllm, or transformers (vLLM's engine "
                       "running transformers' model code)"),
    "cuda_graphs": dict(action=argparse.BooleanOptionalAction, help="vLLM's CUDA graphs where it compiles "
                        "(--no-cuda-graphs: torch.compile alone)"),
    "cpu_attention": dict(choices=CPU_ATTENTION,
                          help="vLLM's CPU attention kernel: auto = vec on AMX CPUs in bf16 (AMX gave wrong text)"),
    "enable_prefix_caching": dict(action=argparse.BooleanOptionalAction,
                                  help="vLLM's prefix cache (--no-enable-prefix-caching: every prompt computed whole)"),
    "hf_max_batch_size": dict(type=whole_arg, help="HF's static batch cap"),
    "hf_cudnn_sdp": dict(action="store_true", help="keep PyTorch's cuDNN attention for HF (naive CUDA default)"),
}


def add_engines_arg(parser, default: str | None = None) -> None:
    """--engines, its help naming every registered engine."""
    known = ", ".join(f"{n} ({s.description})" for n, s in registry.ENGINES.items() if s.in_process)
    parser.add_argument("--engines", default=default or ",".join(registry.default_names()),
                        help=f"comma list of: {known}; or an endpoint's name")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The model, device and every engine's options, grouped by engine; then the endpoint options."""
    parser.add_argument("--model", default=None, help="local HF folder or hub id (default: embedded SmolLM2)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                        help="auto: bfloat16, or float32 on a CPU without native bf16 (AVX512_BF16 or AMX)")
    parser.add_argument("--max-model-len", type=whole_arg, default=2048)
    parser.add_argument("--load-format", default="auto", choices=("auto", "dummy"),
                        help="dummy: random weights of the model's shape (config + tokenizer folder)")
    defaults, placed = EngineConfig(), set()
    for spec in registry.ENGINES.values():
        fields = [f for f in spec.options if f in FLAGS and f not in placed]
        group = parser.add_argument_group(f"{spec.label} options") if fields else None
        for name in fields:
            group.add_argument("--" + name.replace("_", "-"), **{"default": getattr(defaults, name), **FLAGS[name]})
            placed.add(name)
    _add_endpoint_args(parser.add_argument_group("endpoint options"))


def _add_endpoint_args(group) -> None:
    group.add_argument("--base-url", default=None, metavar="URL",
                       help="an OpenAI-compatible server to load-test as engine 'openai' (e.g. http://127.0.0.1:8000)")
    group.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                       help="another server as engine NAME (repeat to compare servers)")
    group.add_argument("--served-model-name", default=None, help="the model name the server(s) serve")
    group.add_argument("--api-key", default=None, help=f"the servers' API key (default: ${API_KEY_ENV})")


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    """An EngineConfig from parsed options (ValueError on a bad value)."""
    chosen = {name: getattr(args, name) for name in FLAGS if hasattr(args, name)}
    return EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
                        load_format=args.load_format, endpoints=endpoints_from(args), **chosen)


def endpoints_from(args: argparse.Namespace) -> tuple:
    """--base-url and each --endpoint as Endpoints, with the served model name and the API key."""
    key = args.api_key or os.environ.get(API_KEY_ENV) or None
    texts = ([args.base_url] if args.base_url else []) + list(args.endpoint)
    return tuple(parse_endpoint(text, args.served_model_name, key) for text in texts)


def engines_from(args: argparse.Namespace) -> tuple[str, ...]:
    """The --engines list as a tuple of names."""
    return tuple(e.strip() for e in args.engines.split(",") if e.strip())
