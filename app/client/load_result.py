"""What a load returns (``LoadResult``: every record plus the client's health), its
progress while it runs, and the notes its connections give; made by ``app.client.runner``
(one process) or ``app.client.shards.merge`` (a dealt run's processes, merged)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from app.client.sched import NORMAL, Scheduling
from app.domain import ClockSource, RequestRecord


@dataclass(frozen=True, slots=True)
class Progress:
    elapsed_s: float
    phase: str  # "warmup" | "measure" | "done"
    planned: int  # measured requests planned
    sent: int  # measured requests sent
    done: int  # measured requests finished (any status)
    errors: int  # measured requests finished not OK (of those already post-processed)
    in_flight: int  # all requests in flight (warm-up included)
    output_tokens: int  # output tokens of finished, post-processed measured requests
    tokens_per_s: float  # output_tokens / time since the measured phase began


@dataclass(frozen=True, slots=True)
class LagStats:
    """Milliseconds; None where there were no samples."""

    n: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @staticmethod
    def of_ns(samples: list[int] | np.ndarray) -> LagStats:
        a = np.asarray(samples, np.float64)
        if a.size == 0:
            return LagStats(0, None, None, None)
        p50, p99 = np.percentile(a, [50, 99])
        return LagStats(int(a.size), float(p50) / 1e6, float(p99) / 1e6, float(a.max()) / 1e6)


@dataclass(slots=True)
class LoadResult:
    records: list[RequestRecord]  # ordered by index; warm-ups included, flagged
    start_mono_ns: int  # run start on time.monotonic_ns(); record times are relative to it
    start_wall: datetime  # the same instant, UTC wall clock
    measure_start_ns: int  # run-relative start of the measured phase (after warm-up)
    end_ns: int  # run-relative end of the run
    clock_source: ClockSource
    achieved_send_rate: float | None  # measured req/s: (sent-1)/(last send - first send)
    send_lag: LagStats
    loop_lag: LagStats
    read_delay: LagStats  # kernel stamp -> user-space read, per event (kernel clock only)
    cpu_wait: LagStats  # per monitor tick: time the load thread was runnable without a CPU
    client_limited: bool
    client_limited_reasons: list[str]
    counts: dict[str, int]
    max_in_flight: int
    stopped: str | None  # why the run ended early ("max_duration", "stopped"), or None
    clock_offset_ns: int  # realtime - monotonic at run start
    clock_drift_max_ns: int  # largest change of that offset seen during the run
    tokenizer: str
    notes: list[str] = field(default_factory=list)
    scheduling: Scheduling = NORMAL  # the load thread's CPU scheduling policy
    cpu_wait_total_ms: float | None = None  # None where the OS does not report it
    # where t0 came from: kernel transmit stamps, or the clock read right before the send
    send_clock_source: ClockSource = ClockSource.USERSPACE
    connections: dict[str, int | str] = field(default_factory=dict)  # ConnStats.to_dict()
    dataset_source: str | None = None  # the dataset file's identity (Workload.source)
    workload_stats: dict[str, object] | None = None  # Workload.stats (a trace's reuse)
    processes: list[dict[str, object]] = field(default_factory=list)  # app.client.shards
    server_controls: dict[str, Any] = field(default_factory=dict)  # ServerControls.record


def connection_notes(c: dict[str, int | str]) -> list[str]:
    """What the connections did that a reader should know."""
    notes: list[str] = []
    if c["retried"]:
        notes.append(
            f"{c['retried']} requests failed on a kept-alive connection the server had "
            "closed, before any response byte, and were sent again on a new one"
        )
    if c["read_to_close"]:
        notes.append(
            f"{c['read_to_close']} responses had neither Content-Length nor chunked framing: "
            "read until the server closed, the connection dropped"
        )
    if c["mode"] == "keep-alive" and c["closed_by_server"]:
        notes.append(
            f"the server closed the connection after {c['closed_by_server']} responses "
            "(Connection: close): the next request on each opened a new one"
        )
    if c["mode"] == "keep-alive" and c["closed_idle"]:
        notes.append(
            f"{c['closed_idle']} idle connections had been closed by the server before "
            "reuse: new ones were opened"
        )
    return notes
