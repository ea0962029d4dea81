"""A request's phases (SPEC 1b) summed up over a run, the user-perceived TTFT, and each
request's send lag.

Phases: queued, the queue wait (due -> a slot and a connection were free), connect (TCP),
tls (handshake), sending (first byte -> last byte of the request left), waiting (last byte
sent -> response head), first token (head -> first token-bearing chunk). sending + waiting +
first token is the TTFT; user-perceived TTFT = connect + tls + TTFT (a reused connection
adds nothing). Summaries are over successful requests, like every latency (SPEC 2); a phase
that did not happen (a reused connection has no connect) is no sample.

Send lag is what the client added before the request's first byte left, its queue wait and
connection setup apart: ``sent - (scheduled + queued) - connect - tls``, so that
``scheduled + queued + send lag + connect + tls = sent`` exactly (``send_lags``). The
run's send lag statistics (the runner's client health), its chart and its export all read
this one definition; the initial burst (``send_lags``' ``burst``) is reported apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.domain import PHASES, RequestRecord, RunTrace

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


def send_lag_ns(
    sent: int | None, scheduled: int, queued: int | None, connect: int | None, tls: int | None
) -> int | None:
    """One request's send lag (ns): ``sent - (scheduled + queued) - connect - tls``, a
    connect or TLS phase that did not happen counting 0; None when it was never sent or
    its queue wait is unknown (an import, a run from before phases were recorded). Not
    floored: a kernel transmit stamp mapped onto the monotonic clock may read a few µs
    early."""
    if sent is None or queued is None:
        return None
    return sent - scheduled - queued - (connect or 0) - (tls or 0)


def send_lag_ms_of_row(r: dict[str, object]) -> float | None:
    """``send_lag_ns`` of one stored request (``*_ns`` columns), in ms."""
    sched = r.get("scheduled_ns")
    rest = [r.get(k) for k in ("sent_ns", "queued_ns", "connect_ns", "tls_ns")]
    ints = [v if isinstance(v, int) else None for v in rest]
    if not isinstance(sched, int) or ints != rest:
        return None
    lag = send_lag_ns(ints[0], sched, ints[1], ints[2], ints[3])
    return None if lag is None else lag / 1e6


@dataclass(frozen=True, slots=True)
class SendLags:
    """Per measured request: its send lag (ns, NaN where ``send_lag_ns`` is None) and
    whether it belongs to the initial burst."""

    lag_ns: F64
    burst: BoolArr

    def counted(self) -> F64:
        """The lags that count in the run's send lag statistics: every sent request's but
        the initial burst's."""
        out: F64 = self.lag_ns[~self.burst & np.isfinite(self.lag_ns)]
        return out

    def in_burst(self) -> F64:
        out: F64 = self.lag_ns[self.burst & np.isfinite(self.lag_ns)]
        return out


def send_lags(
    scheduled: I64, sent: I64, queued: I64, connect: I64, tls: I64, turn: I64
) -> SendLags:
    """``send_lag_ns`` of each measured request (aligned columns, -1 where a value is
    unknown or the phase did not happen; ``turn`` -1 for single requests) and its initial
    burst flag.

    The initial burst: when every request that opens a session (single requests: every
    request) was scheduled at one moment (an unlimited rate: all due at once), those that
    took a never-used slot, i.e. opened their session without a queue wait. Their start
    offers no schedule to fall behind; how long the client took to start them is reported
    as a note instead. Any other request waited for a slot given back after the phase began,
    so its queue wait is above 0."""
    sched = scheduled.astype(np.float64)
    known = (sent >= 0) & (queued >= 0)
    setup = np.where(connect > 0, connect, 0) + np.where(tls > 0, tls, 0)
    lag = np.where(known, sent - scheduled - np.maximum(queued, 0) - setup, 0)
    lag_ns: F64 = np.where(known, lag.astype(np.float64), np.nan)
    opens = turn <= 1
    starts = sched[opens]
    together = bool(starts.size) and bool(starts.min() == starts.max())
    burst: BoolArr = opens & (queued == 0) & together
    return SendLags(lag_ns, burst)


def record_send_lags(records: Sequence[RequestRecord]) -> SendLags:
    """``send_lags`` of these (measured) records."""

    def col(name: str) -> I64:
        vals = [getattr(r, name) for r in records]
        return np.array([-1 if v is None else v for v in vals], np.int64)

    return send_lags(
        col("scheduled_ns"), col("sent_ns"), col("queued_ns"), col("connect_ns"),
        col("tls_ns"), col("turn"),
    )  # fmt: skip
