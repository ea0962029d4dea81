"""A request's phases (SPEC 1b) summed up over a run, and the user-perceived TTFT.

Phases: queued (due -> a slot and a connection were free), connect (TCP), tls (handshake),
sending (first byte -> last byte of the request left), waiting (last byte sent -> response
head), first token (head -> first token-bearing chunk). sending + waiting + first token is
the TTFT; user-perceived TTFT = connect + tls + TTFT (a reused connection adds nothing).
Summaries are over successful requests, like every latency (SPEC 2); a phase that did not
happen (a reused connection has no connect) is no sample.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.domain import PHASES, RunTrace

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]
NO_PHASES = "no connection phases recorded (an import, or a run from before they were)"


def setup_ns(phases: dict[str, I64]) -> F64:
    """connect + tls per request (0 where neither happened: a reused connection)."""
    connect = phases["connect"].astype(np.float64)
    tls = phases["tls"].astype(np.float64)
    out: F64 = np.where(connect > 0, connect, 0.0) + np.where(tls > 0, tls, 0.0)
    return out


def user_ttft_ns(ttft_ns: F64, phases: dict[str, I64] | None) -> F64:
    """User-perceived TTFT = connect + tls + TTFT (NaN where TTFT is, or without phases)."""
    if phases is None:
        return np.full(ttft_ns.shape[0], np.nan)
    out: F64 = ttft_ns + setup_ns(phases)
    return out


def phase_summary(trace: RunTrace, ok: BoolArr) -> dict[str, object]:
    """Per phase: samples, mean, p50 and p99 in ms over the successful requests."""
    if trace.phases is None:
        return {"no_data": NO_PHASES}
    out: dict[str, object] = {}
    for name in PHASES:
        arr = trace.phases[name]
        vals = arr[ok & (arr >= 0)].astype(np.float64) / 1e6
        if vals.size == 0:
            out[name] = {"n": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None}
            continue
        p50, p99 = np.percentile(vals, [50, 99])  # linear interpolation (SPEC 2)
        out[name] = {
            "n": int(vals.size),
            "mean_ms": float(vals.mean()),
            "p50_ms": float(p50),
            "p99_ms": float(p99),
        }
    return out


def user_ttft_ms_of_row(r: dict[str, object]) -> float | None:
    """One stored request's user-perceived TTFT in ms (``*_ns`` columns): connect + tls +
    TTFT; None without a TTFT or without recorded phases."""
    ttft, connect, tls = r.get("ttft_ns"), r.get("connect_ns"), r.get("tls_ns")
    if not isinstance(ttft, int | float) or r.get("conn_id") is None:
        return None
    setup = sum(v for v in (connect, tls) if isinstance(v, int | float))
    return float(ttft + setup) / 1e6
