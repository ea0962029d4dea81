"""Adding a metric is one module (its ``Metric`` in ``app/analysis/metric_defs`` and its
line in ``METRICS``), its test and its docs line: registering one, as its module would, is
all that the report, the CLI, the run page and its figures, the exports, the request page,
the runs list, comparisons, series and their gate, and goodput need. The metric here is
AIPerf's time to second token (second token-bearing event - first): read from the events
and stored per request with no column of its own (``requests.metric_values``), so it needs
no migration either. Every number is hand-computed from the records below."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import metric_defs as md
from app.analysis import series as sa
from app.analysis.metric_defs import TTFT, Metric, RunBasis
from app.cli import render
from app.client.spec import RunSpec
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus
from app.services import compare as compare_svc
from app.services import exports
from app.services import runs as run_svc
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope
from app.storage.models import Request
from tests.web_support import web_app

MS = 1_000_000
F64 = np.ndarray


def _ttst(b: RunBasis) -> F64:
    """Second token-bearing event - first, per request (NaN with fewer than two)."""
    ttft = b.value(TTFT.key)
    assert ttft is not None
    out: F64 = b.since_sent(b.tokens.nth_t(1)) - ttft
    return out


TTST = Metric(
    key="ttst_ms",
    label="TTST",
    title="Time to second token",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    per_request=_ttst,
    seed=7,
    compare_seed=4,
    slo="ttst",
    views=frozenset({"page", "figures", "compare"}),
    headline=("p50",),
    gate=("p50",),
)


def _records(gaps_ms: list[float | None]) -> list[RequestRecord]:
    """One warm-up and a request per gap: first token 10 ms after the send, the second
    ``gap`` ms after it (None: a one-token answer), a third 1 ms later; and one failure."""
    out: list[RequestRecord] = []
    for i, gap in enumerate([5.0, *gaps_ms]):
        sent = i * 100 * MS
        times = [sent + 10 * MS] if gap is None else [sent + 10 * MS, sent + int((10 + gap) * MS)]
        if gap is not None:
            times.append(times[-1] + MS)
        t = np.array(times, np.int64)
        out.append(
            RequestRecord(
                index=i, scheduled_ns=sent, sent_ns=sent, end_ns=int(t[-1]) + MS,
                status=RequestStatus.OK, input_tokens=8, output_tokens=len(times),
                token_source="usage", warmup=i == 0, event_t_ns=t,
                event_bytes=np.full(len(times), 9, np.int32),
                event_kind=np.full(len(times), EventKind.CONTENT, np.int8),
                event_tokens=np.ones(len(times), np.int32),
            )
        )  # fmt: skip
    n = len(out)
    out.append(
        RequestRecord(
            index=n, scheduled_ns=n * 100 * MS, sent_ns=n * 100 * MS, end_ns=n * 100 * MS + MS,
            status=RequestStatus.ERROR, error="HTTP 500", http_status=500, input_tokens=8,
        )
    )  # fmt: skip
    return out


def _store(sessions: sessionmaker[Session], name: str, records: list[RequestRecord]) -> str:
    spec = RunSpec(base_url="http://h:1", model="m", num_prompts=len(records) - 1)
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, name=name, status=RunStatus.RUNNING)
        run_svc.store_requests(s, run_id, records)
    run_svc.finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)
    return run_id


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(md.METRICS, TTST.key, TTST)  # what its line in METRICS does
    yield


def test_a_new_metric_is_one_module(registered: None, db_url: str) -> None:
    engine = make_engine(db_url)
    run_svc.open_database(db_url)
    sessions = session_factory(engine)
    try:
        _check_everywhere(db_url, sessions)
    finally:
        engine.dispose()


def _check_everywhere(url: str, sessions: sessionmaker[Session]) -> None:
    base = _store(sessions, "base", _records([4.0, 6.0, 8.0, None]))
    cand = _store(sessions, "cand", _records([3.0, 5.0, 9.0, None]))
    # the report: TTST of the ok requests 4, 6, 8 ms (the one-token answer has none)
    report = run_svc.run_report(sessions, base)
    d = report["metrics"]["ttst_ms"]
    assert (d["count"], d["mean"], d["p50"], d["max"]) == (3, pytest.approx(6.0), 6.0, 8.0)
    assert report["metrics"]["aggregation"]["ttst_ms"] == "per_request"
    # stored per request without a column of its own: warm-ups too, none where undefined
    with session_scope(sessions) as s:
        rows = s.execute(
            select(Request.idx, Request.metric_values)
            .where(Request.run_id == base)
            .order_by(Request.idx)
        ).all()
    assert [r[1] for r in rows] == [
        {"ttst_ms": 5.0 * MS}, {"ttst_ms": 4.0 * MS}, {"ttst_ms": 6.0 * MS},
        {"ttst_ms": 8.0 * MS}, None, None,
    ]  # fmt: skip
    # the exports: a column in ms
    text = exports.export(sessions, base, "requests.csv").decode()
    got = [r["ttst_ms"] for r in csv.DictReader(io.StringIO(text))]
    assert got == ["5.0", "4.0", "6.0", "8.0", "", ""]
    # the CLI: its row in the latency table
    console = Console(record=True, width=200)
    render.render_report(report, console)
    line = next(x for x in console.export_text().splitlines() if "TTST" in x)
    assert "6.00" in line and "8.00" in line
    # goodput under its SLO: TTST <= 5 ms: one request (4 ms); a spec may name it
    slo = run_svc.run_report(sessions, base, slos_ms={"ttst": 5.0})
    assert slo["metrics"]["good_requests"] == 1
    assert RunSpec(base_url="http://h:1", model="m", goodput={"ttst": 5.0}).goodput == {"ttst": 5.0}
    # comparisons: its samples judged beside the others
    pair = compare_svc.compare_runs(sessions, base, [cand])["pairs"][0]
    assert pair["metrics"]["ttst_ms"]["percentiles"][0]["baseline"] == 6.0
    assert pair["metrics"]["ttst_ms"]["percentiles"][0]["candidate"] == 5.0
    # series: a trend, a point, the gate's defaults
    assert sa.parse_metric("ttst:p50") == sa.MetricRef("ttst_ms", "p50")
    assert sa.point_of(report["metrics"])["ttst_ms"]["p50"][0] == 6.0
    assert "ttst:p50" in sa.gate_defaults()
    # the pages: the run page's row and charts, the runs list, the request page's card
    with TestClient(web_app(url)) as client:
        page = client.get(f"/runs/{base}").text
        assert "Time to second token" in page and 'data-dist="ttst"' in page
        assert 'id="fig-cdf_ttst"' in page and 'id="fig-hist_ttst"' in page
        runs = client.get("/").text
        assert "TTST p50 (ms)" in runs and ">6.00<" in runs
        one = client.get(f"/runs/{base}/requests/2").text
        assert ">TTST<" in one and "6.00 ms" in one


def test_a_view_that_reads_a_column_needs_one() -> None:
    """The requests table and the live panel sort and read SQL columns: a metric without
    one cannot claim them (it would need a migration)."""
    with pytest.raises(ValueError, match="the table and live views read its column"):
        Metric(
            key="x_ms", label="X", title="X", unit="ms", decimals=2, aggregation="per_request",
            per_request=_ttst, views=frozenset({"table"}),
        )  # fmt: skip
