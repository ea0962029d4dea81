"""``linear``: the prefill-vs-decode experiment (SPEC section 6). One weight [W, 4W];
prefill M = batch x seq, decode M = batch, and a sweep of M over powers of two. Event timing
after warm-up; a profiler Chrome trace per prefill/decode shape, captured apart from the
timed loop."""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.probes.device import import_torch, synchronize
from app.probes.spec import LinearParams
from app.probes.timing import stats, time_ms

DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
CUDA_DEFAULTS = {"width": 4096, "batch": 8, "seq": 512, "sweep_max": 4096}
CPU_DEFAULTS = {"width": 256, "batch": 4, "seq": 64, "sweep_max": 256}
TOP_KERNELS = 8
TRACE_ITERS = 3


@dataclass(frozen=True, slots=True)
class Artifact:
    name: str
    content_type: str
    data: bytes


def sweep_ms(max_m: int) -> list[int]:
    out, m = [], 1
    while m <= max_m:
        out.append(m)
        m *= 2
    return out


def _event_time_us(e: Any, cuda: bool) -> float:
    keys = ("self_device_time_total", "self_cuda_time_total") if cuda else ()
    for k in (*keys, "self_cpu_time_total"):
        v = getattr(e, k, None)
        if v:
            return float(v)
    return 0.0


def profile_shape(fn: Callable[[], Any], dev: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """A gzipped Chrome trace of a few calls, and the top kernels by self time."""
    torch = import_torch()
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(TRACE_ITERS):
            fn()
        synchronize(dev)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            data = gzip.compress(f.read(), compresslevel=6)
    finally:
        os.unlink(path)
    events = [e for e in prof.key_averages() if _event_time_us(e, cuda) > 0]
    if cuda:  # kernels only: device-side time
        events = [
            e
            for e in events
            if getattr(e, "device_type", None) is not None
            and "cuda" in str(getattr(e, "device_type", "")).lower()
        ] or events
    events.sort(key=lambda e: _event_time_us(e, cuda), reverse=True)
    top = [
        {
            "name": str(e.key)[:200],
            "calls": int(e.count),
            "self_us": round(_event_time_us(e, cuda), 3),
            "clock": "device" if cuda else "cpu",
        }
        for e in events[:TOP_KERNELS]
    ]
    del torch
    return data, top


def measure(
    dev: Any, m: int, k: int, n: int, dtype: str, warmup: int, iters: int
) -> tuple[dict[str, Any], Callable[[], Any]]:
    torch = import_torch()
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    b = DTYPES[dtype]
    w = torch.randn(k, n, device=dev, dtype=tdt)
    x = torch.randn(m, k, device=dev, dtype=tdt)

    def fn() -> Any:
        return torch.matmul(x, w)

    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        synchronize(dev)
        peak: float = float(torch.cuda.max_memory_allocated(dev))
        peak_src = "measured (torch.cuda.max_memory_allocated)"
    else:
        peak = float(b * (m * k + k * n + m * n))
        peak_src = "computed (x + w + y tensor bytes; the CPU has no allocator peak)"
    st = stats(time_ms(fn, dev, warmup=warmup, iters=iters))
    flops = 2.0 * m * k * n
    nbytes = float(b * (m * k + k * n + m * n))
    sec = st["median_ms"] / 1e3
    row = {
        "m": m,
        "k": k,
        "n": n,
        "dtype": dtype,
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes,
        **st,
        "flops_s": flops / sec,
        "bytes_s": nbytes / sec,
        "peak_tensor_bytes": peak,
        "peak_tensor_source": peak_src,
    }
    return row, fn


def run(
    dev: Any, p: LinearParams, stop: Callable[[], bool]
) -> tuple[dict[str, Any], list[Artifact]]:
    d = CUDA_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
    width = p.width or d["width"]
    batch = p.batch or d["batch"]
    seq = p.seq or d["seq"]
    sweep_max = p.sweep_max or d["sweep_max"]
    k, n = width, 4 * width
    shapes: dict[str, Any] = {}
    artifacts: list[Artifact] = []
    for label, m in (("prefill", batch * seq), ("decode", batch)):
        row, fn = measure(dev, m, k, n, p.dtype, p.warmup, p.iters)
        if p.trace:
            data, top = profile_shape(fn, dev)
            name = f"trace-{label}.json.gz"
            artifacts.append(Artifact(name, "application/gzip", data))
            row |= {"trace": name, "top_kernels": top}
        shapes[label] = row
    sweep: list[dict[str, Any]] = []
    for m in sweep_ms(sweep_max):
        if stop():
            break
        row, _ = measure(dev, m, k, n, p.dtype, p.warmup, p.iters)
        sweep.append(row)
    result = {
        "width": width,
        "batch": batch,
        "seq": seq,
        "dtype": p.dtype,
        "weight_shape": [k, n],
        "shapes": shapes,
        "sweep": sweep,
    }
    return result, artifacts
