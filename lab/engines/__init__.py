"""Engines behind one async protocol (see base.py); heavy libraries load only inside each adapter."""

from __future__ import annotations

from lab.config import EngineConfig
from lab.engines.base import Engine


def create_engine(name: str, config: EngineConfig, model_path: str) -> Engine:
    """Build (not start) the engine called ``name`` for the resolved model.

    Args:
        name: 'hf', 'vllm', 'hf-cb', 'vllm-engine', or the name of one of the config's endpoints.
        config: The shared engine config.
        model_path: A resolved local folder or hub id (lab.model.resolve_model).

    Returns:
        An engine object speaking the Engine protocol.
    """
    endpoint = config.endpoint(name)
    if endpoint is not None:
        from lab.engines.openai import OpenAIEngine

        return OpenAIEngine(endpoint, config, model_path)
    if name == "hf":
        from lab.engines.hf import HFEngine

        return HFEngine(config, model_path)
    if name == "vllm":
        from lab.engines.vllm import VLLMEngine

        return VLLMEngine(config, model_path)
    if name == "vllm-engine":
        from lab.engines.vllm_engine import VLLMStepEngine

        return VLLMStepEngine(config, model_path)
    if name == "hf-cb":
        from lab.engines.hf_cb import HFCBEngine

        return HFCBEngine(config, model_path)
    raise ValueError(f"unknown engine {name!r}; choose hf, vllm, hf-cb or vllm-engine")
