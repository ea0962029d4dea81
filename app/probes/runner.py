"""Run one probe end to end: resolve the device (no silent fallback), fingerprint it,
sample telemetry on a GPU, run the probe, and return what is to be stored."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.probes.device import fingerprint, resolve
from app.probes.device_telemetry import Sampler
from app.probes.linear import Artifact
from app.probes.spec import BatchScalingParams, CeilingsParams, LinearParams, ProbeSpec


@dataclass
class ProbeOutcome:
    fingerprint: dict[str, Any]
    result: dict[str, Any]
    artifacts: list[Artifact] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)


def run_probe(
    spec: ProbeSpec,
    *,
    stop: threading.Event | None = None,
    nvml: Any | None = None,
    telemetry_interval_s: float = 1.0,
) -> ProbeOutcome:
    """Raises ``ProbeError`` (one clear line) when the probe cannot run here."""
    from app.probes import batch_scaling, ceilings, linear

    halt: Callable[[], bool] = (lambda: stop.is_set()) if stop is not None else (lambda: False)
    dev = resolve(spec.device, spec.device_index)
    fp = fingerprint(dev, nvml)
    fp["label"] = "CPU" if dev.type == "cpu" else str(fp.get("device_name"))
    sampler = (
        Sampler.start(dev.index or 0, interval_s=telemetry_interval_s, nvml=nvml)
        if dev.type == "cuda"
        else None
    )
    artifacts: list[Artifact] = []
    try:
        params = spec.typed_params()
        if isinstance(params, CeilingsParams):
            result = ceilings.run(dev, params, halt)
        elif isinstance(params, LinearParams):
            result, artifacts = linear.run(dev, params, halt)
        else:
            assert isinstance(params, BatchScalingParams)
            result = batch_scaling.run(dev, params, halt, sampler)
    finally:
        samples = sampler.stop() if sampler is not None else []
    result["device_type"] = dev.type
    result["stopped"] = halt()
    return ProbeOutcome(fp, result, artifacts, samples)
