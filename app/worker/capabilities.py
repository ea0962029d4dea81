"""What this machine offers, as a worker tells the server when it registers.

Every probe is best effort: a missing ``/proc``, NVML library or torch install gives ``None``
or no GPUs, never an error. NVML (``pynvml`` from nvidia-ml-py) and torch are looked up
lazily; torch is never imported (its version comes from the installed package's metadata).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import socket
from pathlib import Path
from typing import Any

from app import __version__
from app.probes.device import cpu_model
from app.protocol.wire import GPUInfo, WorkerCapabilities


def memory_total_mb(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (AttributeError, ValueError, OSError):
        return None


def torch_version() -> str | None:
    """The installed torch's version, without importing torch."""
    try:
        if importlib.util.find_spec("torch") is None:
            return None
        return importlib.metadata.version("torch")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _cuda_version(nvml: Any) -> str | None:
    try:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040
    except Exception:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def gpus(nvml: Any | None = None) -> list[GPUInfo]:
    """Every GPU NVML sees; [] when NVML (or a driver) is absent or fails."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except Exception:
            return []
    try:
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        try:
            driver: str | None = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        cuda = _cuda_version(nvml)
        out: list[GPUInfo] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(h))
            except Exception:
                uuid = None
            try:
                mem: int | None = int(nvml.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            except Exception:
                mem = None
            out.append(
                GPUInfo(
                    index=i,
                    name=_text(nvml.nvmlDeviceGetName(h)),
                    uuid=uuid,
                    memory_total_mb=mem,
                    driver_version=driver,
                    cuda_version=cuda,
                )
            )
        return out
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def collect(labels: dict[str, str] | None = None) -> WorkerCapabilities:
    return WorkerCapabilities(
        hostname=socket.gethostname() or platform.node() or "unknown",
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
        memory_total_mb=memory_total_mb(),
        gpus=gpus(),
        torch_version=torch_version(),
        tokentrace_version=__version__,
        labels=dict(labels or {}),
    )
