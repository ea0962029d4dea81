"""Device telemetry sampled about once a second through NVML on a background thread:
utilization, memory used, power and SM clock. No NVML (or no GPU): no sampler, and the
caller says so; nothing is invented."""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_INTERVAL_S = 1.0


def _nvml(nvml: Any | None) -> Any | None:
    if nvml is not None:
        return nvml
    try:
        return importlib.import_module("pynvml")
    except Exception:
        return None


class Sampler:
    """``Sampler.start(index)`` returns a running sampler or None; ``stop()`` returns the
    samples: ``{"t_s", "util_pct", "mem_used_mb", "power_w", "sm_clock_mhz"}`` with ``t_s``
    on ``time.monotonic()`` relative to the start (``t0_mono``)."""

    def __init__(self, nvml: Any, handle: Any, index: int, interval_s: float) -> None:
        self._nvml = nvml
        self._h = handle
        self.index = index
        self.interval_s = interval_s
        self.t0_mono = time.monotonic()
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tt-telemetry", daemon=True)

    @classmethod
    def start(
        cls, index: int = 0, *, interval_s: float = DEFAULT_INTERVAL_S, nvml: Any | None = None
    ) -> Sampler | None:
        mod = _nvml(nvml)
        if mod is None:
            return None
        try:
            mod.nvmlInit()
        except Exception:
            return None
        try:
            if index >= int(mod.nvmlDeviceGetCount()):
                mod.nvmlShutdown()
                return None
            handle = mod.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            with contextlib.suppress(Exception):
                mod.nvmlShutdown()
            return None
        s = cls(mod, handle, index, interval_s)
        s.sample()
        s._thread.start()
        return s

    def _read(self, fn: Any) -> Any:
        try:
            return fn()
        except Exception:
            return None

    def sample(self) -> dict[str, Any]:
        n, h = self._nvml, self._h
        util = self._read(lambda: n.nvmlDeviceGetUtilizationRates(h))
        mem = self._read(lambda: n.nvmlDeviceGetMemoryInfo(h))
        power = self._read(lambda: n.nvmlDeviceGetPowerUsage(h))
        clock = self._read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        row = {
            "t_s": round(time.monotonic() - self.t0_mono, 3),
            "util_pct": None if util is None else float(util.gpu),
            "mem_used_mb": None if mem is None else round(int(mem.used) / 2**20, 1),
            "power_w": None if power is None else float(power) / 1000.0,
            "sm_clock_mhz": None if clock is None else int(clock),
        }
        self.samples.append(row)
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def now_s(self) -> float:
        return time.monotonic() - self.t0_mono

    def stop(self) -> list[dict[str, Any]]:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5.0)
            self.sample()
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        return list(self.samples)


def window(samples: Sequence[dict[str, Any]], t0: float, t1: float) -> dict[str, float | None]:
    """Mean utilization and power, and the most memory used, over samples in [t0, t1]."""
    rows = [s for s in samples if t0 <= float(s["t_s"]) <= t1]

    def vals(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r.get(key) is not None]

    util, power, mem = vals("util_pct"), vals("power_w"), vals("mem_used_mb")
    return {
        "util_pct_mean": sum(util) / len(util) if util else None,
        "power_w_mean": sum(power) / len(power) if power else None,
        "mem_used_mb_max": max(mem) if mem else None,
        "samples": float(len(rows)),
    }
