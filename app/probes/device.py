"""torch, the device, and its fingerprint. torch is imported here, lazily: nothing in the
dashboard imports this module. No silent fallback: asking for CUDA without it raises."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
from pathlib import Path
from typing import Any


class ProbeError(Exception):
    """A probe cannot run (missing torch, no CUDA, a bad model path): one clear line."""


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip() and key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return platform.processor() or None


def import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ProbeError(
            "torch is not installed on this worker: pip install 'tokentrace[probes]'"
        ) from None


def resolve(device: str, index: int = 0) -> Any:
    """The ``torch.device`` asked for; ProbeError when CUDA is asked for and missing."""
    torch = import_torch()
    if device == "cpu":
        return torch.device("cpu")
    if device != "cuda":
        raise ProbeError(f"unknown device {device!r}: use cuda or cpu")
    if not torch.cuda.is_available():
        raise ProbeError(
            f"CUDA was requested but is not available here (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}); no silent fallback: "
            "use --device cpu to probe the CPU on purpose"
        )
    if index >= torch.cuda.device_count():
        raise ProbeError(
            f"CUDA device {index} does not exist ({torch.cuda.device_count()} visible)"
        )
    return torch.device("cuda", index)


def synchronize(dev: Any) -> None:
    if dev.type == "cuda":
        import_torch().cuda.synchronize(dev)


def _nvml_facts(index: int, nvml: Any | None = None) -> dict[str, Any]:
    """UUID, driver, clocks and power limit through NVML; {} without it."""
    try:
        nvml = nvml or importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:
        return {}
    out: dict[str, Any] = {}
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        reads: dict[str, Any] = {
            "uuid": lambda: nvml.nvmlDeviceGetUUID(h),
            "driver_version": nvml.nvmlSystemGetDriverVersion,
            "memory_total_bytes": lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).total),
            "sm_clock_max_mhz": lambda: int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)),
            "mem_clock_max_mhz": lambda: int(
                nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM)
            ),
            "sm_clock_mhz": lambda: int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        }
        for key, read in reads.items():
            try:
                v = read()
            except Exception:
                continue
            out[key] = v.decode() if isinstance(v, bytes) else v
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


def fingerprint(dev: Any, nvml: Any | None = None) -> dict[str, Any]:
    """What the probe ran on: enough to tell two devices (and two software stacks) apart."""
    torch = import_torch()
    base: dict[str, Any] = {
        "device_type": dev.type,
        "torch_version": torch.__version__,
        "host": platform.node(),
    }
    if dev.type == "cpu":
        return base | {
            "device_name": f"CPU: {cpu_model() or platform.processor() or 'unknown'}",
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        }
    idx = dev.index or 0
    props = torch.cuda.get_device_properties(idx)
    cap = torch.cuda.get_device_capability(idx)
    return (
        base
        | {
            "device_name": props.name,
            "device_index": idx,
            "memory_total_bytes": int(props.total_memory),
            "compute_capability": f"{cap[0]}.{cap[1]}",
            "sm_count": int(props.multi_processor_count),
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
        }
        | _nvml_facts(idx, nvml)
    )
