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


def pytest_collection_modifyitems(config, items):
    """Run unit tests first, then the slow ones that load real engines, then the browser ones."""
    order = {"slow": 1, "ui": 2}

    def rank(item):
        return max((order[m.name] for m in item.iter_markers() if m.name in order), default=0)

    items.sort(key=rank)
