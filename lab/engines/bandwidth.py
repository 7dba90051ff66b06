"""The device's memory bandwidth, measured once per process with a copy kernel, for the floor of a step.

A copy of N bytes reads N and writes N, so bandwidth = 2N / time (the way STREAM's copy and nvbandwidth count
it); the best of a few copies is kept, as a floor wants the fastest the memory can go. On a GPU the figure is
set beside the part's published peak where the part is known (a check, never used in place of the
measurement). torch is imported here only, when a run first asks.
"""

from __future__ import annotations

import functools
import time

COPY_BYTES = {"cpu": 256 * 1024**2, "cuda": 2 * 1024**3}  # far above any cache, small beside the pool
REPEATS = 5
PUBLISHED = {  # bytes/s, the vendors' datasheets: a check beside the measurement, never used for the floor
    "H200": 4.8e12,
    "H100 80GB HBM3": 3.35e12,  # SXM
    "H100 PCIe": 2.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "L4": 3.0e11,
}


@functools.cache
def measure(device: str) -> dict:
    """Copy bandwidth of ``device`` ("cpu" or "cuda"), with how it was measured and, on a known GPU, the
    published peak."""
    import torch

    size = COPY_BYTES["cuda" if device.startswith("cuda") else "cpu"]
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    best = min(_copy_s(torch, src, dst, device) for _ in range(REPEATS + 1))  # the first warms the pages
    found = {"bytes_per_s": 2 * size / best, "method": f"torch copy of {size // 1024**2} MiB, best of {REPEATS + 1}"}
    if device == "cpu":
        found["method"] += f", {torch.get_num_threads()} threads"
    else:
        found.update(published(torch.cuda.get_device_name(device)))
    return found


def _copy_s(torch, src, dst, device: str) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    began = time.perf_counter()
    dst.copy_(src)
    sync()
    return time.perf_counter() - began


def published(part: str) -> dict:
    """The published peak of a GPU part the lab knows, by name; empty for any other."""
    for name, peak in PUBLISHED.items():
        if name in part:
            return {"part": part, "published_bytes_per_s": peak}
    return {"part": part}
