"""An engine's failed batch in plain words: out of memory names what was asked for and what was free.

The in-process HF engines raise these words as their fault; they live beside the engines (not in the memory
planner) so that an engine never imports the planner, which reads the engines' own sizes.
"""

from __future__ import annotations

import re

from lab.environment import GIB, gib, read_device

ASKED = re.compile(r"tried to allocate\s+([\d.]+)\s*(bytes|KiB|MiB|GiB)", re.IGNORECASE)
UNITS = {"bytes": 1, "kib": 1024, "mib": 1024**2, "gib": GIB}


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA OutOfMemoryError, Python's MemoryError, or the CPU allocator's refusal."""
    text = str(exc).lower()
    return (type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError)
            or "can't allocate memory" in text or "out of memory" in text)


def asked_bytes(message: str) -> int | None:
    """The allocation an out-of-memory message names ('Tried to allocate 2.00 GiB', '... 123 bytes')."""
    found = ASKED.search(message)
    return int(float(found.group(1)) * UNITS[found.group(2).lower()]) if found else None


def failure_words(engine: str, exc: BaseException, device: str, batch: int) -> str:
    """An engine's failed batch in plain words; out of memory names what was asked for and what was free."""
    if not is_out_of_memory(exc):
        return f"{engine} failed a batch of {batch} requests: {type(exc).__name__}: {exc}"
    asked = asked_bytes(str(exc))
    return (f"{engine} ran out of memory on {device} with a batch of {batch} requests: it asked for "
            f"{gib(asked) if asked else 'more memory'} and {gib(read_device(device).free_bytes)} was free "
            f"(lower the users, the output length or the batch size)")
