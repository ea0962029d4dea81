"""Timing device work: CUDA events after warm-up (never a host clock around an asynchronous
launch); on the CPU, where work is synchronous, ``perf_counter_ns``. Median and spread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.probes.device import import_torch, synchronize


def time_ms(fn: Callable[[], Any], dev: Any, *, warmup: int, iters: int) -> list[float]:
    """Milliseconds of each of ``iters`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    synchronize(dev)
    out: list[float] = []
    if dev.type == "cuda":
        torch = import_torch()
        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(dev)
        return [float(s.elapsed_time(e)) for s, e in pairs]
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def stats(samples_ms: list[float]) -> dict[str, float]:
    """median, best (fastest), p10, p90 and spread ((p90 - p10) / median) of the times."""
    a = np.asarray(samples_ms, np.float64)
    med = float(np.median(a))
    p10, p90 = (float(x) for x in np.percentile(a, [10, 90]))
    return {
        "median_ms": med,
        "best_ms": float(a.min()),
        "p10_ms": p10,
        "p90_ms": p90,
        "spread": (p90 - p10) / med if med > 0 else 0.0,
        "iters": float(a.size),
    }
