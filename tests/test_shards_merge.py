"""The merge of a dealt run's processes (issue 26 part 3), by hand: every record in one run,
the run's client health as its worst process had it, a process that fell behind naming
itself in the run's client-limited reasons, a dead process's requests lost and said."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from app.client.load_result import LagStats, LoadResult
from app.client.shards.merge import ProcessOutcome, merge, start_skew_ns
from app.client.shards.plan import Plan, Share
from app.client.spec import RunSpec
from app.domain import ClockSource, RequestRecord, RequestStatus

MS = 1_000_000


def _rec(i: int, p: int, *, sched: int, lag: int, tokens: int = 10, queued: int = 0,
         connect: int | None = None) -> RequestRecord:  # fmt: skip
    sent = sched + queued + lag + (connect or 0)
    return RequestRecord(
        index=i, scheduled_ns=sched, sent_ns=sent, end_ns=sent + 50 * MS,
        status=RequestStatus.OK, output_tokens=tokens, queued_ns=queued, connect_ns=connect,
        conn_id=1, process=p, event_t_ns=np.array([sent + 10 * MS], np.int64),
        event_bytes=np.ones(1, np.int32), event_kind=np.zeros(1, np.int8),
        event_tokens=np.ones(1, np.int32),
    )  # fmt: skip


def _result(loop_p99: float, reasons: list[str], sent: int) -> LoadResult:
    return LoadResult(
        records=[], start_mono_ns=0, start_wall=datetime.now(UTC), measure_start_ns=0,
        end_ns=200 * MS, clock_source=ClockSource.KERNEL, achieved_send_rate=None,
        send_lag=LagStats(0, None, None, None), loop_lag=LagStats(10, 0.1, loop_p99, 20.0),
        read_delay=LagStats(0, None, None, None), cpu_wait=LagStats(0, None, None, None),
        client_limited=bool(reasons), client_limited_reasons=reasons,
        counts={"sent": sent}, max_in_flight=2, stopped=None, clock_offset_ns=0,
        clock_drift_max_ns=0, tokenizer="builtin", notes=[], cpu_wait_total_ms=1.5,
        connections={"mode": "keep-alive", "opened": 2},
    )  # fmt: skip


def _plan() -> Plan:
    spec = RunSpec(base_url="http://h:1", model="m", num_prompts=8)
    shares = [Share(p, None, [], [], [], [], []) for p in range(3)]
    return Plan(spec, 3, shares, 8, 0, None, None, [])


def test_merge_by_hand() -> None:
    # process 0: requests 0, 3, 6 (sent lags 0.2, 1.0, 0.4 ms; the first connects 0.5 ms)
    p0 = [_rec(0, 0, sched=0, lag=200_000, connect=500_000), _rec(3, 0, sched=30 * MS, lag=MS),
          _rec(6, 0, sched=60 * MS, lag=400_000)]  # fmt: skip
    # process 1: requests 1, 4, 7, behind (its own rule said so)
    p1 = [_rec(1, 1, sched=10 * MS, lag=3 * MS, tokens=4), _rec(4, 1, sched=40 * MS, lag=0),
          _rec(7, 1, sched=70 * MS, lag=2 * MS)]  # fmt: skip
    # process 2: died after request 2; request 5 never came back
    p2 = [_rec(2, 2, sched=20 * MS, lag=100_000)]
    outs = [
        ProcessOutcome(0, 3, p0, _result(0.5, [], 3), {"run": 20_000}, 0.25, 101),
        ProcessOutcome(1, 3, p1, _result(12.5, ["event-loop lag p99 12.50 ms > 10 ms"], 3)),
        ProcessOutcome(2, 2, p2, None, error="the process exited with code -9"),
    ]
    res = merge(
        _plan(), outs, start_ns=5, start_wall=datetime.now(UTC), measure_start_ns=0,
        end_ns=200 * MS, stopped=None, tokenizer="builtin", notes=["a note"],
    )  # fmt: skip
    assert [r.index for r in res.records] == [0, 1, 2, 3, 4, 6, 7]
    assert res.counts["lost"] == 1 and res.counts["sent"] == 3 + 3 + 1
    assert res.counts["planned"] == 8 and res.counts["ok"] == 7 and res.counts["unsent"] == 0
    assert res.client_limited
    assert res.client_limited_reasons == ["process 1: event-loop lag p99 12.50 ms > 10 ms"]
    assert res.loop_lag.p99_ms == 12.5 and res.loop_lag.n == 20  # the worst process's
    assert res.notes[0] == "a note"
    assert (
        "process 2 ended before its load did (the process exited with code -9): 1 of its 2 "
        "requests are lost (never recorded)"
    ) in res.notes
    assert res.connections == {"mode": "keep-alive", "opened": 4}
    assert res.cpu_wait_total_ms == 3.0
    # every record's send lag (sent - scheduled - queued - connect), none in a burst:
    # 0.2 1.0 0.4 3 0 2 0.1 ms -> p99 by linear interpolation over 7 samples
    lags = [0.2, 1.0, 0.4, 3.0, 0.0, 2.0, 0.1]
    assert res.send_lag.p99_ms == pytest.approx(float(np.percentile(lags, 99)))
    rows = {r["process"]: r for r in res.processes}
    assert rows[0]["start_skew_ms"] == pytest.approx(0.2)  # its first request, connect apart
    assert rows[1]["start_skew_ms"] == pytest.approx(3.0)
    # tokens over (last end - measured start): process 0 ends at 60 + 0.4 + 50 ms
    assert rows[0]["tokens_per_s"] == pytest.approx(30 / 0.1104)
    assert rows[1]["output_tokens"] == 24 and rows[1]["client_limited"] is True
    assert rows[2]["lost"] == 1 and rows[2]["requests"] == 1
    assert rows[0]["cpu_s"] == 0.25 and rows[0]["wake_us"] == {"run": 20.0}
    assert start_skew_ns([]) is None
