"""Shared fixtures: a tiny tokenizer for unit tests, real engines for integration tests."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class CharTokenizer:
    """A stand-in tokenizer for unit tests of workloads and the driver: one id per character."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 1000 for c in text]


@pytest.fixture
def char_tokenizer():
    return CharTokenizer()


def running_session(config, engines=("hf", "vllm")):
    """A started LabSession on its own event loop (``session.loop``), stopped when the generator ends.

    Modules that load the real engines wrap it in a module-scoped fixture:
    ``yield from running_session(CONFIG)``.
    """
    import asyncio

    from lab.session import LabSession

    loop = asyncio.new_event_loop()
    session = LabSession(config, engines)
    loop.run_until_complete(session.start())
    session.loop = loop
    yield session
    loop.run_until_complete(session.stop())
    loop.close()


def pytest_collection_modifyitems(config, items):
    """Run unit tests first, then the slow ones that load real engines, then the browser ones."""
    order = {"slow": 1, "ui": 2}

    def rank(item):
        return max((order[m.name] for m in item.iter_markers() if m.name in order), default=0)

    items.sort(key=rank)
