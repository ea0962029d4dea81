"""A dealt run's processes merged into one ``LoadResult``: every record (global indices, each
naming its process), the client's health as the run's worst process had it, and a figure
row per process (``load_stats["processes"]``, the run page's per-process table).

* send lag is recomputed over the merged records (its one definition, ``record_send_lags``);
  event-loop lag, read delay and CPU wait are per process: the run shows its worst process's
  p99 (samples summed), each process's in its row;
* a process that fell behind (``client_limited`` by the runner's rule) marks the run,
  its reasons prefixed with the process;
* a process that died: its requests never recorded are ``counts["lost"]`` and said in a
  note (the run is then partial, ``app.analysis.trust.run_status``'s ``lost``);
* start skew: how late a process's first measured request left against its due time (its
  send lag: ``sent - (scheduled + queued) - connect - tls``); ``wake`` how late the process
  returned from the common start instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from app.analysis.phases import record_send_lags, send_lag_ns
from app.client.load_result import LagStats, LoadResult
from app.client.sched import NORMAL
from app.client.shards.plan import Plan
from app.domain import ClockSource, RequestRecord, RequestStatus


@dataclass(slots=True)
class ProcessOutcome:
    """What the parent got of one process."""

    process: int
    planned: int  # its measured requests planned
    records: list[RequestRecord] = field(default_factory=list)
    result: LoadResult | None = None  # None: it died or failed before the end
    wake_ns: dict[str, int] = field(default_factory=dict)
    cpu_run_s: float | None = None
    pid: int | None = None
    error: str | None = None  # why it ended without a result

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.warmup]


def start_skew_ns(records: list[RequestRecord]) -> int | None:
    """The send lag of a process's first measured request (by its due time)."""
    sent = [r for r in records if not r.warmup and r.sent_ns is not None]
    if not sent:
        return None
    first = min(sent, key=lambda r: (r.scheduled_ns + (r.queued_ns or 0), r.index))
    return send_lag_ns(first.sent_ns, first.scheduled_ns, first.queued_ns or 0,
                       first.connect_ns, first.tls_ns)  # fmt: skip


def _worst(stats: list[LagStats]) -> LagStats:
    have = [s for s in stats if s.n]
    if not have:
        return LagStats(0, None, None, None)
    worst = max(have, key=lambda s: s.p99_ms or 0.0)
    return LagStats(
        sum(s.n for s in have),
        max(s.p50_ms or 0.0 for s in have),
        worst.p99_ms,
        max(s.max_ms or 0.0 for s in have),
    )


def _tokens(records: list[RequestRecord]) -> int:
    return sum(
        r.output_tokens or 0 for r in records if not r.warmup and r.status is RequestStatus.OK
    )


def process_row(o: ProcessOutcome, measure_start_ns: int) -> dict[str, object]:
    """One process's figures (the run page's per-process table)."""
    measured = o.measured
    ends = [r.end_ns for r in measured if r.end_ns is not None]
    span = (max(ends) - measure_start_ns) / 1e9 if ends else 0.0
    tokens = _tokens(measured)
    lag = LagStats.of_ns(record_send_lags(measured).counted())
    res = o.result
    skew = start_skew_ns(measured)
    return {
        "process": o.process,
        "pid": o.pid,
        "planned": o.planned,
        "requests": len(measured),
        "ok": sum(1 for r in measured if r.status is RequestStatus.OK),
        "output_tokens": tokens,
        "tokens_per_s": tokens / span if span > 0 else None,
        "send_lag_p99_ms": lag.p99_ms,
        "loop_lag_p99_ms": res.loop_lag.p99_ms if res else None,
        "cpu_wait_total_ms": res.cpu_wait_total_ms if res else None,
        "cpu_s": o.cpu_run_s,
        "start_skew_ms": None if skew is None else skew / 1e6,
        "wake_us": {k: v / 1e3 for k, v in o.wake_ns.items()},
        "client_limited": bool(res and res.client_limited),
        "lost": 0 if res else max(0, o.planned - len(measured)),
        "error": o.error,
    }


def merge(
    plan: Plan,
    outcomes: list[ProcessOutcome],
    *,
    start_ns: int,
    start_wall: datetime,
    measure_start_ns: int,
    end_ns: int,
    stopped: str | None,
    tokenizer: str,
    notes: list[str],
) -> LoadResult:
    """The processes' records and health as one run (the module doc's rules)."""
    records = sorted((r for o in outcomes for r in o.records), key=lambda r: r.index)
    measured = [r for r in records if not r.warmup]
    results = [o.result for o in outcomes if o.result is not None]
    statuses = [r.status for r in measured]
    lost = sum(max(0, o.planned - len(o.measured)) for o in outcomes if o.result is None)
    sent = sum(r.counts["sent"] for r in results) + sum(
        sum(1 for r in o.measured if r.sent_ns is not None) for o in outcomes if o.result is None
    )
    counts = {
        "planned": plan.planned,
        "warmup": sum(1 for r in records if r.warmup),
        "sent": sent,
        "unsent": max(0, plan.planned - sent - lost),
        "ok": statuses.count(RequestStatus.OK),
        "error": statuses.count(RequestStatus.ERROR),
        "timeout": statuses.count(RequestStatus.TIMEOUT),
        "cancelled": statuses.count(RequestStatus.CANCELLED),
        "lost": lost,
    }
    reasons: list[str] = []
    run_notes = list(notes)
    for o in outcomes:
        if o.result is None:
            gone = max(0, o.planned - len(o.measured))
            run_notes.append(
                f"process {o.process} ended before its load did ({o.error or 'it died'}): "
                f"{gone} of its {o.planned} requests are lost (never recorded)"
            )
            continue
        reasons += [f"process {o.process}: {x}" for x in o.result.client_limited_reasons]
        run_notes += [f"process {o.process}: {x}" for x in o.result.notes]
    st = sorted(r.sent_ns for r in measured if r.sent_ns is not None)
    rate: float | None = None
    if len(st) >= 2:
        rate = (len(st) - 1) / ((st[-1] - st[0]) / 1e9) if st[-1] > st[0] else math.inf
    kernel = bool(results) and all(r.clock_source is ClockSource.KERNEL for r in results)
    kernel_send = bool(results) and all(r.send_clock_source is ClockSource.KERNEL for r in results)
    conns: dict[str, int | str] = {}
    for res in results:
        for k, v in res.connections.items():
            if isinstance(v, int) and not isinstance(v, bool):
                prev = conns.get(k, 0)
                conns[k] = (prev if isinstance(prev, int) else 0) + v
            else:
                conns.setdefault(k, v)
    cpu_totals = [r.cpu_wait_total_ms for r in results if r.cpu_wait_total_ms is not None]
    first = results[0] if results else None
    return LoadResult(
        records=records,
        start_mono_ns=start_ns,
        start_wall=start_wall,
        measure_start_ns=measure_start_ns,
        end_ns=end_ns,
        clock_source=ClockSource.KERNEL if kernel else ClockSource.USERSPACE,
        achieved_send_rate=rate,
        send_lag=LagStats.of_ns(record_send_lags(measured).counted()),
        loop_lag=_worst([r.loop_lag for r in results]),
        read_delay=_worst([r.read_delay for r in results]),
        cpu_wait=_worst([r.cpu_wait for r in results]),
        client_limited=bool(reasons),
        client_limited_reasons=reasons,
        counts=counts,
        max_in_flight=sum(r.max_in_flight for r in results),
        stopped=stopped or next((r.stopped for r in results if r.stopped), None),
        clock_offset_ns=first.clock_offset_ns if first else 0,
        clock_drift_max_ns=max((r.clock_drift_max_ns for r in results), default=0),
        tokenizer=tokenizer,
        notes=run_notes,
        scheduling=first.scheduling if first else NORMAL,
        cpu_wait_total_ms=sum(cpu_totals) if cpu_totals else None,
        send_clock_source=ClockSource.KERNEL if kernel_send else ClockSource.USERSPACE,
        connections=conns,
        dataset_source=plan.source,
        workload_stats=plan.stats,
        processes=[process_row(o, measure_start_ns) for o in outcomes],
    )
