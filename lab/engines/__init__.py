"""Engines behind one async protocol (see base.py); heavy libraries load only inside each adapter, and every
engine is declared once in registry.py."""

from lab.engines.registry import ENGINES, EngineSpec, create_engine, register, spec

__all__ = ["ENGINES", "EngineSpec", "create_engine", "register", "spec"]
