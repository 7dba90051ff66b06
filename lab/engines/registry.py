"""Every engine the lab can load, declared once: its name, label, capabilities, factory and options.

config (which names a plan may use), session (start order, how agreement prompts are sent), memory (how many
vLLM pools to plan), metrics (where KV figures come from), plots (labels), the CLI (--engines help, option
groups) and the page (engine choices) all read this table. A new engine is its adapter module plus one
``register(EngineSpec(...))`` here. Factories are "module:Class" strings imported only when an engine is built,
so that reading the table imports no engine library (and nothing of the lab's).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    """One engine kind.

    Attributes:
        name: What plans, results and --engines call it.
        label: How ratios and legends name it.
        factory: "module:Class" of its adapter; the class takes (config, model_path), or (endpoint, config,
            model_path) for an endpoint.
        description: One line for help texts and legends.
        color: Its colour in every plot.
        paged: Its KV lives in blocks (usage = 1 - free / total).
        kv_pool: It holds a vLLM KV pool of its own (the memory plan gives each its share; it starts first).
        kv_source: Where its KV figures come from: "batch" (derived from the batch it holds), "allocator"
            (its block allocator, read every step) or "metrics" (a server's /metrics).
        streaming: Its tokens reach the lab as they are made.
        in_process: It runs under the lab's own process (engines with child processes of their own included).
        static_batch: It pads a batch to one length: agreement prompts go to it one at a time.
        default: It loads unless --engines says otherwise.
        options: The EngineConfig fields it reads (the CLI groups their flags under its name).
    """

    name: str
    label: str
    factory: str
    description: str
    color: str = "#6c757d"
    paged: bool = False
    kv_pool: bool = False
    kv_source: str = "allocator"
    streaming: bool = True
    in_process: bool = True
    static_batch: bool = False
    default: bool = False
    options: tuple[str, ...] = ()

    def build(self, *args):
        """The adapter, built (not started); its module is imported here."""
        module, _, cls = self.factory.partition(":")
        return getattr(importlib.import_module(module), cls)(*args)


ENGINES: dict[str, EngineSpec] = {}
ENDPOINT = "openai"  # the endpoint kind: an OpenAI-compatible server (more endpoints get their own names)
VLLM_OPTIONS = ("gpu_memory_utilization", "kv_cache_gib", "block_size", "max_num_seqs", "max_num_batched_tokens",
                "enforce_eager", "model_impl", "cuda_graphs", "cpu_attention", "num_kv_blocks", "enable_prefix_caching")


def register(spec: EngineSpec) -> EngineSpec:
    """Add (or replace) an engine kind."""
    ENGINES[spec.name] = spec
    return spec


def names() -> tuple[str, ...]:
    """Every in-process engine's name, in the order registered."""
    return tuple(n for n, s in ENGINES.items() if s.in_process)


def default_names() -> tuple[str, ...]:
    """What loads unless --engines says otherwise."""
    return tuple(n for n, s in ENGINES.items() if s.default)


def spec(name: str) -> EngineSpec:
    """The spec of engine ``name``; any name outside the table is an endpoint (a server named by the user)."""
    return ENGINES.get(name) or ENGINES[ENDPOINT]


def label(name: str) -> str:
    """An engine's short label; an endpoint keeps its own name."""
    return ENGINES[name].label if name in ENGINES and ENGINES[name].in_process else name


def with_pool(engines) -> list[str]:
    """The engines among ``engines`` that hold a vLLM KV pool each."""
    return [n for n in engines if spec(n).kv_pool]


def create_engine(name: str, config, model_path: str):
    """Build (not start) engine ``name``: an in-process kind, or one of the config's endpoints.

    Raises:
        ValueError: a name that is neither.
    """
    endpoint = config.endpoint(name)
    if endpoint is not None:
        return ENGINES[ENDPOINT].build(endpoint, config, model_path)
    if name not in names():
        raise ValueError(f"unknown engine {name!r}; choose {', '.join(names())}")
    return ENGINES[name].build(config, model_path)


HF_OPTIONS = ("hf_max_batch_size", "hf_cudnn_sdp", "hf_compile", "hf_threads")
for _spec in (
    EngineSpec("hf", "HF", "lab.engines.hf:HFEngine", "HF generate (static batch)",
               color="#e4572e", kv_source="batch", static_batch=True, default=True, options=HF_OPTIONS),
    EngineSpec("vllm", "vLLM", "lab.engines.vllm:VLLMEngine", "vLLM (paged, continuous)",
               color="#17bebb", paged=True, kv_pool=True, default=True, options=VLLM_OPTIONS),
    EngineSpec("hf-cb", "HF-CB", "lab.engines.hf_cb:HFCBEngine", "HF continuous batching (paged)",
               color="#f3a712", paged=True, options=("kv_cache_gib", "hf_cb_page_size", "hf_cb_cuda_graphs")),
    EngineSpec("vllm-engine", "vLLM-engine", "lab.engines.vllm_engine:VLLMStepEngine",
               "vLLM engine loop (no async front end)", color="#0b6e69", paged=True, kv_pool=True,
               options=VLLM_OPTIONS),
    EngineSpec(ENDPOINT, "OpenAI", "lab.engines.openai:OpenAIEngine", "an OpenAI-compatible server",
               kv_source="metrics", in_process=False, options=("endpoints",)),
):
    register(_spec)
