"""Queue wait and send lag apart (issue 24 item 3): the wait for a concurrency slot (or, open
loop, for a connection) is the ``queued`` phase; send lag is only what the client added
between that moment and the request's first byte, connection setup apart. Every view reads
that one definition: the runner's client health (run page header, CLI), the run page's
charts, the request page and the per-request export. Checked against hand-computed records
and, for real closed-loop runs, against numbers recomputed from the raw export."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from app.analysis.phases import record_send_lags, send_lag_ns
from app.cli.render import render_report
from app.client.runner import LagStats, run_load
from app.domain import RequestRecord, RequestStatus, trace_from_records
from app.figures.phases import wait_figures
from app.services import runs as run_svc
from app.services.runs import open_database
from app.targets.sim_config import SimConfig
from tests.test_client import Server, run
from tests.test_sessions import conversations, replier, spec
from tests.web_support import bench, web_app

MS = 1_000_000
US = 1_000


def _rec(
    i: int,
    *,
    scheduled: int,
    queued: int | None,
    lag: int,
    connect: int | None = None,
    tls: int | None = None,
    turn: int | None = None,
    sent: bool = True,
) -> RequestRecord:
    """A request whose send lag is ``lag`` by construction: sent = scheduled + queued + lag
    + connect + tls."""
    t0 = scheduled + (queued or 0) + lag + (connect or 0) + (tls or 0)
    ev = np.array([t0 + 20 * MS], np.int64)
    return RequestRecord(
        index=i, scheduled_ns=scheduled, sent_ns=t0 if sent else None, end_ns=t0 + 21 * MS,
        status=RequestStatus.OK, output_tokens=1, event_t_ns=ev,
        event_bytes=np.ones(1, np.int32), event_kind=np.zeros(1, np.int8),
        event_tokens=np.ones(1, np.int32), queued_ns=queued, connect_ns=connect, tls_ns=tls,
        conn_id=1 if queued is not None else None, conn_reused=connect is None,
        session=None if turn is None else 0, turn=turn,
    )  # fmt: skip


# ------------------------------------------------------------------------ by hand


def test_closed_loop_records_by_hand() -> None:
    """Concurrency 2, every request due at 5 ms (an unlimited rate). Requests 0 and 1 took
    never-used slots (no queue wait): the initial burst, reported apart. Request 2 waited
    40 ms for a slot, 3 waited 17,046 ms (the issue's case): that is queue wait, not send
    lag. Counted send lags 0.03, 2.0, 0.5 ms: p50 0.5, p99 = 0.5 + (2.0 - 0.5) x 0.98 =
    1.97 ms (linear interpolation at position 1.98)."""
    recs = [
        _rec(0, scheduled=5 * MS, queued=0, lag=50 * US, connect=200 * US),
        _rec(1, scheduled=5 * MS, queued=0, lag=120 * US, connect=300 * US, tls=900 * US),
        _rec(2, scheduled=5 * MS, queued=40 * MS, lag=30 * US),
        _rec(3, scheduled=5 * MS, queued=17_046 * MS, lag=2 * MS),
        _rec(4, scheduled=5 * MS, queued=80 * MS, lag=500 * US, connect=100 * US),
        _rec(5, scheduled=5 * MS, queued=90 * MS, lag=0, sent=False),  # never sent
    ]
    lags = record_send_lags(recs)
    assert lags.burst.tolist() == [True, True, False, False, False, False]
    assert sorted(lags.counted().tolist()) == [30 * US, 500 * US, 2 * MS]
    assert sorted(lags.in_burst().tolist()) == [50 * US, 120 * US]
    assert np.isnan(lags.lag_ns[5])
    stats = LagStats.of_ns(lags.counted())
    assert stats.p50_ms == pytest.approx(0.5) and stats.p99_ms == pytest.approx(1.97)
    assert stats.max_ms == pytest.approx(2.0)
    # the scalar definition (exports, the request page) gives the same numbers
    r3 = recs[3]
    assert send_lag_ns(r3.sent_ns, r3.scheduled_ns, r3.queued_ns, None, None) == 2 * MS

    trace = trace_from_records(recs)
    sched = np.full(6, 5 * MS, np.int64)
    send, queue = wait_figures(trace, sched, np.full(6, -1, np.int64))
    by_name = {t["name"]: t for t in send["data"]}
    assert list(by_name) == ["requests", "initial burst (not in the p99)"]
    assert by_name["requests"]["y"] == [0.03, 0.5, 2.0]  # in order of the free time (x)
    assert by_name["requests"]["x"] == [0.045, 0.085, 17.051]  # s: scheduled + queue wait
    assert by_name["initial burst (not in the p99)"]["y"] == [0.05, 0.12]
    assert max(by_name["requests"]["y"]) < 17_046  # the wait for a slot is not send lag
    assert send["layout"]["showlegend"] is True
    assert queue["data"][0]["y"] == [0.0, 0.0, 40.0, 80.0, 90.0, 17_046.0]


def test_open_loop_has_no_burst_and_sessions_only_their_first_turns() -> None:
    # open loop: scheduled apart, none waited: every sent request's lag counts
    recs = [_rec(i, scheduled=i * 100 * MS, queued=0, lag=(i + 1) * 10 * US) for i in range(3)]
    lags = record_send_lags(recs)
    assert not lags.burst.any()
    assert lags.counted().tolist() == [10 * US, 20 * US, 30 * US]
    # sessions started at once: the first turns on never-used slots are the burst; a later
    # turn (due where its reply ended) never is, nor a first turn that waited for a slot
    recs = [
        _rec(0, scheduled=0, queued=0, lag=40 * US, turn=1),
        _rec(1, scheduled=0, queued=0, lag=60 * US, turn=1),
        _rec(2, scheduled=30 * MS, queued=0, lag=70 * US, turn=2),
        _rec(3, scheduled=0, queued=55 * MS, lag=80 * US, turn=1),
    ]
    lags = record_send_lags(recs)
    assert lags.burst.tolist() == [True, True, False, False]
    assert lags.counted().tolist() == [70 * US, 80 * US]


def test_runs_without_a_queue_wait_have_no_send_lag_not_zero() -> None:
    """A run from before phases were recorded (no queue wait): no send lag, no queue wait:
    "no data" on the charts, None in the export row."""
    recs = [_rec(i, scheduled=0, queued=None, lag=10 * MS) for i in range(3)]
    lags = record_send_lags(recs)
    assert np.isnan(lags.lag_ns).all() and lags.counted().size == 0
    send, queue = wait_figures(trace_from_records(recs), np.zeros(3, np.int64), None)
    for fig in (send, queue):
        assert fig["data"] == []
        assert "no data: no queue wait recorded" in json.dumps(fig["layout"])
    from app.services.exports import request_row

    row = {"idx": 0, "scheduled_ns": 0, "sent_ns": 10 * MS, "queued_ns": None}
    assert request_row(row)["send_lag_ms"] is None


# ------------------------------------------------------------------------ real runs

C = 2
N = 14


@pytest.fixture(scope="module")
def closed_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A stored closed-loop run: concurrency 2, 14 requests all due at once (rate inf)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('qw') / 'qw.db'}"
    sessions = open_database(url)
    run_id = bench(
        sessions, SimConfig(ttft_ms=20, itl_ms=1, seed=2), "closed loop",
        num_prompts=N, max_concurrency=C, request_rate=float("inf"), input_len=16,
        output_len=8,
    )  # fmt: skip
    return url, run_id


def _export(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/runs/{run_id}/requests.json")
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = [row for row in r.json() if not row["warmup"]]
    return sorted(rows, key=lambda row: row["idx"])


def test_every_view_reads_the_same_send_lag_and_queue_wait(
    closed_loop: tuple[str, str],
) -> None:
    url, run_id = closed_loop
    with TestClient(web_app(url)) as client:
        _check_views(client, url, run_id)


def _check_views(client: TestClient, url: str, run_id: str) -> None:
    rows = _export(client, run_id)
    assert len(rows) == N and all(r["status"] == "ok" for r in rows)
    ends = np.sort([r["end_ms"] for r in rows])
    for k, r in enumerate(rows):
        setup = (r["connect_ms"] or 0.0) + (r["tls_ms"] or 0.0)
        # the export's columns partition the time from schedule to first byte exactly
        total = r["queued_ms"] + r["send_lag_ms"] + setup
        assert total == pytest.approx(r["sent_ms"] - r["scheduled_ms"], abs=1e-6)
        free = r["scheduled_ms"] + r["queued_ms"]
        if k < C:  # a never-used slot: no wait
            assert r["queued_ms"] == 0.0
        else:  # the (k - C + 1)-th slot given back: after that many requests had ended
            assert free >= ends[k - C] - 1e-6, (k, free, ends[k - C])
    queued = np.array([r["queued_ms"] for r in rows])
    lag = np.array([r["send_lag_ms"] for r in rows])
    assert lag.max() < queued.max()  # the slot wait lands in the queue wait, not the lag

    # the header's send lag: the runner's statistics, over every request but the initial
    # burst (the first C, on never-used slots), recomputed from the export
    report = run_svc.run_report(open_database(url), run_id)
    stored = report["load"]["send_lag_ms"]
    counted = lag[C:]
    assert stored["n"] == N - C
    assert stored["p99_ms"] == pytest.approx(float(np.percentile(counted, 99)), abs=1e-6)
    assert stored["max_ms"] == pytest.approx(float(counted.max()), abs=1e-6)
    page = client.get(f"/runs/{run_id}").text
    health = re.search(r'id="client-health">client: (.*?)</p>', page, re.S)
    assert health is not None
    assert f"send lag p99 {np.percentile(counted, 99):.2f} ms" in health.group(1)
    assert f"(max {counted.max():.2f} ms)" in health.group(1)

    # the charts: the same send lags (counted and burst apart) and queue waits
    figs = {
        key: json.loads(m.group(1).replace("\\u003c", "<").replace("\\u003e", ">"))
        for key, m in (
            (k, re.search(rf'<script type="application/json" id="fig-{k}">(.*?)</script>', page,
                          re.S))
            for k in ("send_lag", "queue_wait")
        )
        if m is not None
    }  # fmt: skip
    assert set(figs) == {"send_lag", "queue_wait"}
    traces = {t["name"]: t for t in figs["send_lag"]["data"]}
    assert sorted(traces["requests"]["y"]) == pytest.approx(sorted(counted), abs=1e-3)
    assert sorted(traces["initial burst (not in the p99)"]["y"]) == pytest.approx(
        sorted(lag[:C]), abs=1e-3
    )
    assert sorted(figs["queue_wait"]["data"][0]["y"]) == pytest.approx(sorted(queued), abs=1e-3)

    # the CLI report: the same client line; the phases line's queue wait is a phase,
    # summarised over successful requests (all of them here) like every phase
    console = Console(file=io.StringIO(), width=400, record=True)
    render_report(report, console)
    text = console.export_text()
    assert f"send lag p99 {np.percentile(counted, 99):.2f} ms" in text
    q50, q99 = np.percentile(queued, [50, 99])
    assert f"queue wait {q50:.3f}/{q99:.3f}" in text

    # the REST API's request rows: the same send lags and queue waits
    api = client.get(f"/api/v1/runs/{run_id}/requests", params={"limit": 100}).json()
    items = sorted((i for i in api["items"] if not i["warmup"]), key=lambda i: i["index"])
    assert [i["send_lag_ms"] for i in items] == [r["send_lag_ms"] for r in rows]
    assert [i["queued_ms"] for i in items] == [r["queued_ms"] for r in rows]

    # the request page of the longest wait: its queue wait and send lag, in ms
    late = rows[int(np.argmax(queued))]
    html = client.get(f"/runs/{run_id}/requests/{late['idx']}").text
    assert f'id="queue-wait">{late["queued_ms"]:,.2f} ms' in html
    assert f'id="send-lag">{late["send_lag_ms"]:,.2f} ms' in html


def test_a_sessions_first_turn_waits_for_a_session_slot(tmp_path: Path) -> None:
    """One active session at a time, two sessions due at once: the second session's first
    turn waited for the first session's slot (its queue wait), then each later turn was due
    where the reply before it ended: no queue wait, and its send lag is small (not the wait
    for the reply)."""
    path = conversations(tmp_path, [["a", "b"], ["c", "d"]])

    async def go() -> Any:
        async with Server(replier(gap_s=0.005)) as srv:
            return await run_load(spec(srv.url, path, max_concurrency=1), run_tag="q")

    res = run(go())
    recs = {(r.session, r.turn): r for r in res.records if not r.warmup}
    assert sorted(recs) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    s0t1, s0t2, s1t1, s1t2 = recs[(0, 1)], recs[(0, 2)], recs[(1, 1)], recs[(1, 2)]
    assert s0t1.scheduled_ns == s1t1.scheduled_ns  # both sessions due at once
    assert s0t1.queued_ns == 0 and s0t2.queued_ns == 0 and s1t2.queued_ns == 0
    assert s1t1.queued_ns is not None and s0t2.end_ns is not None
    # it could start only once session 0 had ended (its last reply's end)
    assert s1t1.scheduled_ns + s1t1.queued_ns >= s0t2.end_ns
    assert s0t2.scheduled_ns == s0t1.end_ns and s1t2.scheduled_ns == s1t1.end_ns
    lags = record_send_lags(list(recs.values()))
    lag1 = send_lag_ns(s1t1.sent_ns, s1t1.scheduled_ns, s1t1.queued_ns, s1t1.connect_ns,
                       s1t1.tls_ns)  # fmt: skip
    assert lag1 is not None and lag1 < s1t1.queued_ns
    assert res.send_lag.n == int((~lags.burst & np.isfinite(lags.lag_ns)).sum()) == 3
