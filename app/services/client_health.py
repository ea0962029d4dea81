"""The load generator's own health for one run, as short phrases for the CLI and the run page."""

from __future__ import annotations

import math
from typing import Any


def as_float(v: Any) -> float | None:
    """A finite float from a report value, else None (missing, bool, text, inf, NaN)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def client_health(report: dict[str, Any]) -> list[str]:
    """The client's own health for one run, as short "label value" phrases (empty when the
    run carries none, e.g. an import)."""
    load = report.get("load") or {}
    out: list[str] = []

    def ms(d: Any, key: str) -> str | None:
        v = as_float((d or {}).get(key)) if isinstance(d, dict) else None
        return None if v is None else f"{v:.2f} ms"

    sched = load.get("scheduling")
    if isinstance(sched, dict) and sched.get("policy"):
        out.append(f"scheduling {sched['policy']}")
    late = load.get("trace_lateness_ms")
    if isinstance(late, dict) and ms(late, "p99_ms") is not None:
        out.append(
            f"arrival lateness vs the trace p50 {ms(late, 'p50_ms')}, p99 {ms(late, 'p99_ms')} "
            f"(max {ms(late, 'max_ms')})"
        )
    wl = load.get("workload")
    reuse = as_float(wl.get("prefix_reuse_ratio")) if isinstance(wl, dict) else None
    if reuse is not None:
        out.append(f"trace prefix reuse {reuse:.1%} of blocks")
    for key, label in (("send_lag_ms", "send lag"), ("loop_lag_ms", "event-loop lag")):
        p99, mx = ms(load.get(key), "p99_ms"), ms(load.get(key), "max_ms")
        if p99 is not None:
            out.append(f"{label} p99 {p99} (max {mx})")
    total = as_float(load.get("cpu_wait_total_ms"))
    if total is not None:
        mx = ms(load.get("cpu_wait_ms"), "max_ms")
        out.append(f"waited for a CPU {total:.2f} ms in all (longest {mx or '—'})")
    rd = ms(load.get("read_delay_ms"), "p99_ms")
    if rd is not None:
        out.append(f"kernel stamp to read p99 {rd}")
    send_clock = load.get("send_clock")
    if send_clock in ("kernel", "userspace"):
        what = "kernel transmit stamps" if send_clock == "kernel" else "the clock before the send"
        out.append(f"t0 from {what}")
    conns = load.get("connections")
    if isinstance(conns, dict) and isinstance(conns.get("opened"), int):
        mode, opened, reused = conns.get("mode"), conns["opened"], conns.get("reused", 0)
        ahead = conns.get("opened_ahead")
        line = f"connections {mode}: {opened} opened"
        if isinstance(ahead, int) and ahead:
            line += f" ({ahead} ahead of an agent's fan-out)"
        line += f", {reused} requests on a reused one"
        if conns.get("retried"):
            line += f", {conns['retried']} retried"
        out.append(line)
    return out
