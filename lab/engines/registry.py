"""Every engine the lab can load, declared once: its name, label, capabilities, factory, options and every fact
the rest of the lab reads about it.

config (which names a plan may use), session (start order, how agreement prompts are sent, what each holds, the
rungs it starts), memory (how each engine's share is planned), metrics and labels (where KV figures come from, which
ratios a run shows, whether a KV figure is measured), plots (labels, colours, title notes: read at each use), sweeps
(which knobs an engine has), the why ladder (its rungs and how each is run), the CLI (--engines help, option groups)
and the page (engine choices) all read this table. A new engine is its adapter module plus one
``register(EngineSpec(...))`` here. Factories are "module:Class" strings imported only when an engine is built,
so that reading the table imports no engine library (and nothing of the lab's).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

MEMORY_KINDS = ("pool", "weights", "paged", "nothing")  # how an engine's share is planned (lab.memory), in order


@dataclass(frozen=True)
class Rung:
    """One rung of the why ladder (lab.experiments.ladder): a setting of an engine and the mechanism it adds.

    Attributes:
        name: The rung's name (explain.json, --rungs, the plot).
        order: Its place in the ladder (rungs are listed by it; a chain rung adds its mechanism to the chain rung
            before it).
        label: What runs, in a few words.
        mechanism: What changes from the rung it is set against (empty for the baseline).
        against: A side rung's chain rung (set against it, outside the product); empty for a chain rung.
        overrides: EngineConfig fields this rung sets.
        cuda_only: Why the rung does not run on a CPU (its mechanism needs CUDA), or empty where it runs anywhere.
        cpu_absent: The mechanism it adds cannot exist on a CPU, in words (a merged step leaves it out), or empty.
        flags: The `vllm serve` flags that make this rung (vLLM rungs), or what sets it elsewhere.
        engine: The lab engine that runs it when not the engine declaring it ('offline': vLLM's LLM class).
        factory: "module:Class" of the engine that runs it where that is no registered engine (offline: vLLM's
            LLM.generate loop); the class takes (config, model_path).
        family: The registered engine that engine belongs to (offline: vllm): its turns are labelled by it, and
            it starts, asks for memory and settles as that engine does.
        optional: Its engine may fail to start on a device (vLLM's transformers backend, its compiler): the rung is
            then skipped with the error, the ladder goes on.
        warmup_bound: (seconds, what its warm-up does in words): a warm-up past the bound drops the rung (hf-compiled:
            its compiles); empty for no bound.
        fits_load: Its engine is sized to the load: a batch no wider than the users, a cache as long as the
            load's longest request (hf-compiled: one compiled shape; attention over unused slots would be a cost of
            the cache's size, not of compiling).
        whole_batch: Its engine takes every request at once (``generate(requests)`` -> (tokens, seconds), at most
            as many running as users, its args in ``args``), not through the lab's users: no per-step figures, and a
            turn cannot be interrupted (offline).
    """

    name: str
    order: float
    label: str
    mechanism: str
    against: str = ""
    overrides: tuple[tuple[str, object], ...] = ()
    cuda_only: str = ""
    cpu_absent: str = ""
    flags: str = ""
    engine: str = ""
    factory: str = ""
    family: str = ""
    optional: bool = False
    warmup_bound: tuple[float, str] = ()
    fits_load: bool = False
    whole_batch: bool = False


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
        memory: What it holds and how lab.memory plans its share (MEMORY_KINDS): "pool" its weights and a vLLM KV
            pool of its own (it starts first); "weights" its weights, its KV growing with each batch; "paged" its
            own weights, a paged pool of the lab's KV budget and its attention mask; "nothing" nothing on this
            device (a server elsewhere, a stand-in).
        kv_source: Where its KV figures come from: "batch" (derived from the batch it holds), "allocator"
            (its block allocator, read every step) or "metrics" (a server's /metrics).
        in_process: It runs under the lab's own process (engines with child processes of their own included).
        static_batch: It pads a batch to one length: agreement prompts go to it one at a time.
        default: It loads unless --engines says otherwise.
        options: The EngineConfig fields it reads (the CLI groups their flags under its name).
        ratio_base: The ratio top / it is shown where both ran (``RATIO_TOP``'s speed over its own).
        ratio_color: That ratio's colour in every plot.
        knobs: The EngineConfig fields a sweep may change on it (each restarts only this engine).
        step_tokens: The tokens one step holds at most, where the lab caps it (0: the engine's own cap); a "paged"
            engine's attention mask is planned from it.
        rungs: Its rungs on the why ladder.
        contrast: (engine, words): the engine its bars are read against and what the gap between them measures;
            the bars' title says the words where both ran.
    """

    name: str
    label: str
    factory: str
    description: str
    color: str = "#6c757d"
    paged: bool = False
    memory: str = "nothing"
    kv_source: str = "allocator"
    in_process: bool = True
    static_batch: bool = False
    default: bool = False
    options: tuple[str, ...] = ()
    ratio_base: bool = False
    ratio_color: str = ""
    knobs: tuple[str, ...] = ()
    step_tokens: int = 0
    rungs: tuple[Rung, ...] = ()
    contrast: tuple[str, str] = ()

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_KINDS:
            raise ValueError(f"{self.name}: memory {self.memory!r} is not one of {', '.join(MEMORY_KINDS)}")

    @property
    def kv_pool(self) -> bool:
        """It holds a vLLM KV pool of its own (the memory plan gives each its share; it starts first)."""
        return self.memory == "pool"

    def build(self, *args):
        """The adapter, built (not started); its module is imported here."""
        return load(self.factory)(*args)


def load(factory: str):
    """The class a "module:Class" string names, its module imported now."""
    module, _, cls = factory.partition(":")
    return getattr(importlib.import_module(module), cls)


ENGINES: dict[str, EngineSpec] = {}
ENDPOINT = "openai"  # the endpoint kind: an OpenAI-compatible server (more endpoints get their own names)
BASELINE = "hf"  # the engine every comparison starts from (the ratio's and the ladder's base)
RATIO_TOP = "vllm"  # the engine whose speed is divided by each ratio base (the ladder's top)
BATCHING = "hf-cb"  # the engine that adds continuous batching alone to the baseline (the ladder's words name its step)
VLLM_OPTIONS = ("gpu_memory_utilization", "kv_cache_gib", "block_size", "max_num_seqs", "max_num_batched_tokens",
                "enforce_eager", "model_impl", "cuda_graphs", "cpu_attention", "num_kv_blocks", "enable_prefix_caching")


def register(spec: EngineSpec) -> EngineSpec:
    """Add (or replace) an engine kind."""
    ENGINES[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove an engine kind (a stand-in registered for a while)."""
    ENGINES.pop(name, None)


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


def ratio_bases() -> tuple[str, ...]:
    """The engines RATIO_TOP's speed is divided by where they ran, in the order registered."""
    return tuple(n for n, s in ENGINES.items() if s.ratio_base)


def knobs() -> dict[str, str]:
    """Every sweepable knob -> the engine it changes; the knobs of engines holding a KV pool first."""
    found = {knob: n for n, s in ENGINES.items() for knob in s.knobs}
    return dict(sorted(found.items(), key=lambda item: not ENGINES[item[1]].kv_pool))


class View(Mapping):
    """A mapping read from the registry at each use, so that an engine registered later brings its entries."""

    def __init__(self, read):
        self._read = read

    def __getitem__(self, key):
        return self._read()[key]

    def __iter__(self):
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())


def rungs() -> dict[str, Rung]:
    """Every engine's rungs on the why ladder, in ladder order, each with the engine that runs it."""
    found = [replace(r, engine=r.engine or n) for n, s in ENGINES.items() for r in s.rungs]
    return {r.name: r for r in sorted(found, key=lambda r: r.order)}


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
VLLM_KNOBS = ("max_num_seqs", "block_size", "kv_cache_gib", "gpu_memory_utilization")
ON_CPU_EAGER = "on a CPU the lab runs vLLM eager (its compiled CPU path gave wrong text)"
HF_RUNGS = (
    Rung("hf", 10, "HF generate(), static batches, eager", "", flags="transformers' generate() (the lab's hf)"),
    Rung("hf-compiled", 15, "HF generate(), static cache + torch.compile",
         "per-step overhead, HF's own fix (static KV cache + torch.compile with CUDA graphs)", against="hf",
         overrides=(("hf_compile", True),), cuda_only="torch.compile's CUDA graphs need CUDA; on a CPU HF stays eager",
         flags="generate() with a StaticCache and torch.compile (--hf-compile)", warmup_bound=(300.0, "its compiles"),
         fits_load=True),
)
HF_CB_RUNGS = (
    Rung("hf-cb", 20, "HF continuous batching, paged KV (no CUDA graphs)",
         "continuous batching + paged KV (transformers' code)", overrides=(("hf_cb_cuda_graphs", False),),
         flags="transformers' generate_batch (continuous batching)"),
)
VLLM_RUNGS = (
    Rung("vllm-hf-code", 30, "vLLM's engine running transformers' model code, eager",
         "vLLM's engine (its scheduler, block manager and batching loop, on transformers' model code)",
         overrides=(("model_impl", "transformers"), ("enforce_eager", True)),
         flags="--model-impl transformers --enforce-eager", optional=True),
    Rung("vllm-eager", 40, "vLLM, its own model code, eager (no compile, no CUDA graphs)",
         "vLLM's model code and kernels", overrides=(("enforce_eager", True),),
         cuda_only=ON_CPU_EAGER + ": this rung would be the vllm rung", flags="--enforce-eager"),
    Rung("vllm-compiled", 50, "vLLM, torch.compile without CUDA graphs", "torch.compile (vLLM's compilation)",
         overrides=(("enforce_eager", False), ("cuda_graphs", False)), cuda_only=ON_CPU_EAGER,
         cpu_absent=ON_CPU_EAGER, flags="-O '{\"cudagraph_mode\": \"NONE\"}'", optional=True),
    Rung("vllm", 60, "vLLM served (AsyncLLM), device default", "per-step overhead (CUDA graphs)",
         overrides=(("enforce_eager", None),), cpu_absent="on a CPU there are no CUDA graphs to add",
         flags="(vllm serve's defaults for the device)"),
    Rung("offline", 66, "vLLM offline (LLM.generate's loop), as many at once as users",
         "front end: LLM.generate, no users, no streaming", against="vllm", overrides=(("enforce_eager", None),),
         flags="LLM.generate()", engine="offline", factory="lab.engines.vllm_offline:OfflineVLLM", family="vllm",
         whole_batch=True),
)
VLLM_ENGINE_RUNGS = (
    Rung("vllm-engine", 65, "vLLM step loop (LLMEngine.step)", "front end: the step loop instead of AsyncLLM",
         against="vllm", overrides=(("enforce_eager", None),), flags="LLMEngine.step() in a loop"),
)
for _spec in (
    EngineSpec("hf", "HF", "lab.engines.hf:HFEngine", "HF generate (static batch)",
               color="#e4572e", kv_source="batch", static_batch=True, default=True, options=HF_OPTIONS,
               memory="weights", ratio_base=True, ratio_color="#4b3f72", knobs=("hf_max_batch_size",),
               rungs=HF_RUNGS),
    EngineSpec("vllm", "vLLM", "lab.engines.vllm:VLLMEngine", "vLLM (paged, continuous)",
               color="#17bebb", paged=True, memory="pool", default=True, options=VLLM_OPTIONS, knobs=VLLM_KNOBS,
               rungs=VLLM_RUNGS),
    EngineSpec("hf-cb", "HF-CB", "lab.engines.hf_cb:HFCBEngine", "HF continuous batching (paged)",
               color="#f3a712", paged=True, memory="paged",
               options=("kv_cache_gib", "hf_cb_page_size", "hf_cb_cuda_graphs"), ratio_base=True,
               ratio_color="#a5668b", step_tokens=4096, rungs=HF_CB_RUNGS),
    EngineSpec("vllm-engine", "vLLM-engine", "lab.engines.vllm_engine:VLLMStepEngine",
               "vLLM engine loop (no async front end)", color="#0b6e69", paged=True, memory="pool",
               options=VLLM_OPTIONS, rungs=VLLM_ENGINE_RUNGS,
               contrast=("vllm", "vLLM-engine minus vLLM: the per-token cost of vLLM's async front end "
                                 "(the served engine streams every token through it)")),
    EngineSpec(ENDPOINT, "OpenAI", "lab.engines.openai:OpenAIEngine", "an OpenAI-compatible server",
               kv_source="metrics", in_process=False, options=("endpoints",)),
):
    register(_spec)
