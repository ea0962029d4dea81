"""What a load run hands back (``LoadResult``), assembled from the runner's state once
its requests have ended (``app.client.runner``): counts by status, the receive and send
clocks, the achieved send rate, the client's own lag figures, whether the client kept up
(``client_limited`` and why) and the run's notes."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Protocol

import numpy as np

from app.analysis.phases import record_send_lags
from app.client.clocks import ClockMap, kernel_stamps_supported
from app.client.connpool import ConnPool
from app.client.load_result import LagStats, LoadResult, connection_notes
from app.client.sched import Scheduling
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer
from app.domain import ClockSource, RequestRecord, RequestStatus

MONITOR_PERIOD_S = 0.005  # the runner's monitor tick (loop lag and CPU wait samples)
CPU_WAIT_NOTE_MS = 1.0  # a longer wait for a CPU within one monitor tick is noted in the run


class RunState(Protocol):
    """What the result is assembled from (``app.client.load_run.LoadRun``'s state)."""

    spec: RunSpec
    tok: BuiltinTokenizer | HFTokenizer
    clock: ClockMap
    pool: ConnPool
    scheduling: Scheduling
    records: list[RequestRecord]
    start_ns: int
    start_wall: datetime
    measure_start_ns: int
    planned: int
    sent_measured: int
    slots: int
    fd_capped: bool
    pool_waits: int
    max_in_flight: int
    halted: str | None
    kernel_stamps: bool
    kernel_streams: int
    user_streams: int
    kernel_sends: int
    user_sends: int
    send_times: list[int]
    loop_lag: list[int]
    read_delay: list[np.ndarray]
    cpu_wait_ticks: list[int]
    cpu_wait_first: int | None
    cpu_wait_last: int | None


def load_result(r: RunState, end_ns: int) -> LoadResult:
    """The run's ``LoadResult``: its records in index order, counts, clocks, the client's
    lag figures and whether it kept up (``client_limited`` and why), and the notes."""
    spec = r.spec
    records = sorted(r.records, key=lambda rec: rec.index)
    measured = [rec for rec in records if not rec.warmup]
    statuses = [rec.status for rec in measured]
    counts = {
        "planned": r.planned,
        "warmup": sum(1 for rec in records if rec.warmup),
        "sent": r.sent_measured,
        "unsent": r.planned - r.sent_measured,
        "ok": statuses.count(RequestStatus.OK),
        "error": statuses.count(RequestStatus.ERROR),
        "timeout": statuses.count(RequestStatus.TIMEOUT),
        "cancelled": statuses.count(RequestStatus.CANCELLED),
    }
    notes: list[str] = []
    if r.kernel_streams and not r.user_streams:
        clock = ClockSource.KERNEL
    elif r.kernel_streams == 0 and r.user_streams == 0:
        would = r.kernel_stamps and kernel_stamps_supported()
        clock = ClockSource.KERNEL if would else ClockSource.USERSPACE
    else:
        clock = ClockSource.USERSPACE
        if r.kernel_streams:
            notes.append(
                f"mixed receive stamps: {r.kernel_streams} streams kernel, "
                f"{r.user_streams} user-space; reported as user-space"
            )
    st = sorted(r.send_times)
    rate: float | None = None
    if len(st) >= 2 and st[-1] > st[0]:
        rate = (len(st) - 1) / ((st[-1] - st[0]) / 1e9)
    elif len(st) >= 2:
        rate = math.inf
    # the initial burst's start is reported apart: it offers no schedule to fall behind
    lags = record_send_lags(measured)
    send_lag = LagStats.of_ns(lags.counted())
    burst_lag = lags.in_burst()
    loop_lag = LagStats.of_ns(r.loop_lag)
    read_delay = LagStats.of_ns(
        np.concatenate(r.read_delay) if r.read_delay else np.zeros(0, np.int64)
    )
    bound = spec.client_lag_bound_ms
    reasons: list[str] = []
    if send_lag.p99_ms is not None and send_lag.p99_ms > bound:
        reasons.append(f"send lag p99 {send_lag.p99_ms:.2f} ms > {bound:g} ms")
    if loop_lag.p99_ms is not None and loop_lag.p99_ms > bound:
        reasons.append(f"event-loop lag p99 {loop_lag.p99_ms:.2f} ms > {bound:g} ms")
    if burst_lag.size > 1:
        notes.append(
            f"starting the initial burst of {burst_lag.size} requests took "
            f"{burst_lag.max() / 1e6:.1f} ms (TTFT counts from each request's own start)"
        )
    if r.fd_capped:
        reasons.append(
            f"concurrency capped at {r.slots} (asked {spec.max_concurrency}): the process may "
            "not open more sockets (RLIMIT_NOFILE)"
        )
    if r.pool_waits:
        reasons.append(
            f"{r.pool_waits} requests waited for a free connection (the client allows "
            f"{r.slots} open at once)"
        )
    notes.extend(connection_notes(r.pool.stats.to_dict()))
    if r.kernel_sends and not r.user_sends:
        send_clock = ClockSource.KERNEL
    else:
        send_clock = ClockSource.USERSPACE
        if r.kernel_sends:
            notes.append(
                f"mixed send stamps: {r.kernel_sends} requests kernel transmit stamps, "
                f"{r.user_sends} the clock before the send; reported as user-space"
            )
    cpu_wait = LagStats.of_ns(r.cpu_wait_ticks)
    cpu_wait_total: float | None = None
    if r.cpu_wait_first is not None and r.cpu_wait_last is not None:
        cpu_wait_total = (r.cpu_wait_last - r.cpu_wait_first) / 1e6
    if cpu_wait.max_ms is not None and cpu_wait.max_ms >= CPU_WAIT_NOTE_MS:
        effect = (
            "kernel receive stamps are unaffected, but reads in those moments coalesce"
            if clock is ClockSource.KERNEL
            else "user-space receive stamps taken then are late by up to that much"
        )
        notes.append(
            f"the load thread waited {cpu_wait_total or 0.0:.1f} ms in all for a CPU that other "
            f"tasks held (longest {cpu_wait.max_ms:.1f} ms within one "
            f"{MONITOR_PERIOD_S * 1e3:g} ms tick): {effect}; a quieter CPU or real-time "
            "priority (--realtime) avoids it"
        )
    drift = r.clock.max_drift_ns
    if clock is ClockSource.KERNEL and drift > 1_000_000:
        notes.append(f"realtime/monotonic offset moved by {drift / 1e6:.2f} ms during the run")
    return LoadResult(
        records=records,
        start_mono_ns=r.start_ns,
        start_wall=r.start_wall,
        measure_start_ns=r.measure_start_ns,
        end_ns=end_ns,
        clock_source=clock,
        achieved_send_rate=rate,
        send_lag=send_lag,
        loop_lag=loop_lag,
        read_delay=read_delay,
        cpu_wait=cpu_wait,
        client_limited=bool(reasons),
        client_limited_reasons=reasons,
        counts=counts,
        max_in_flight=r.max_in_flight,
        stopped=r.halted,
        clock_offset_ns=r.clock.initial_offset_ns,
        clock_drift_max_ns=drift,
        tokenizer=r.tok.name,
        notes=notes,
        scheduling=r.scheduling,
        cpu_wait_total_ms=cpu_wait_total,
        send_clock_source=send_clock,
        connections=r.pool.stats.to_dict(),
    )
