"""Exports stream page by page: the same rows as the stored records say (recomputed here
from ``load_records``, not from the export code), valid Parquet with one row group per page,
and at most 2 exports at once per client."""

from __future__ import annotations

import csv
import io
import json
import socket
import time
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus
from app.services import exports as export_svc
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.live_server import LiveServerFactory


def _records(n: int, tokens: int) -> list[RequestRecord]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        sent = i * 1_000_000
        t = sent + np.cumsum(rng.integers(100_000, 900_000, tokens)).astype(np.int64)
        out.append(
            RequestRecord(
                index=i,
                scheduled_ns=sent,
                sent_ns=sent,
                end_ns=int(t[-1]),
                status=RequestStatus.OK,
                output_tokens=tokens,
                event_t_ns=t,
                event_bytes=rng.integers(5, 50, tokens).astype(np.int32),
                event_kind=np.zeros(tokens, np.int8),
                event_tokens=np.ones(tokens, np.int32),
            )
        )
    return out


def _seed(db_url: str, n: int, tokens: int) -> str:
    sessions = open_database(db_url)
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, RunSpec(base_url="http://h:1", model="m"), source="bench")
        repo.insert_requests(s, run_id, _records(n, tokens))
    return run_id


def _expected_events(db_url: str, run_id: str) -> list[tuple[int, int, float, float]]:
    """(idx, event, t_ms, since_sent_ms) per event, straight from the stored records."""
    sessions = open_database(db_url)
    with session_scope(sessions) as s:
        recs = repo.load_records(s, run_id)
    return [
        (r.index, j, t / 1e6, (t - (r.sent_ns or 0)) / 1e6)
        for r in recs
        for j, t in enumerate(r.event_t_ns.tolist())
    ]


def test_events_exports_stream_the_stored_events(db_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(export_svc, "EVENT_PAGE", 7)  # many pages for a small run
    run_id = _seed(db_url, 30, 11)
    sessions = open_database(db_url)
    want = _expected_events(db_url, run_id)
    chunks = list(export_svc.export_stream(sessions, run_id, "events.csv"))
    assert len(chunks) >= 5  # one per page of 7 requests: streamed, not built whole
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert [(int(r["idx"]), int(r["event"])) for r in rows] == [w[:2] for w in want]
    assert [float(r["t_ms"]) for r in rows] == pytest.approx([w[2] for w in want])
    assert [float(r["since_sent_ms"]) for r in rows] == pytest.approx([w[3] for w in want])
    parts = list(export_svc.export_stream(sessions, run_id, "events.parquet"))
    pf = pq.ParquetFile(io.BytesIO(b"".join(parts)))
    assert pf.metadata.num_row_groups == 5 and pf.metadata.num_rows == 330
    table = pf.read()
    assert table.column("t_ms").to_pylist() == pytest.approx([w[2] for w in want])
    lines = b"".join(export_svc.export_stream(sessions, run_id, "events.jsonl")).splitlines()
    assert len(lines) == 330 and json.loads(lines[-1])["idx"] == 29


def test_request_exports_stream(db_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(export_svc, "PAGE", 4)
    run_id = _seed(db_url, 10, 3)
    sessions = open_database(db_url)
    arr = json.loads(b"".join(export_svc.export_stream(sessions, run_id, "requests.json")))
    lines = b"".join(export_svc.export_stream(sessions, run_id, "requests.jsonl")).splitlines()
    assert [r["idx"] for r in arr] == list(range(10)) == [json.loads(x)["idx"] for x in lines]
    pf = pq.ParquetFile(
        io.BytesIO(b"".join(export_svc.export_stream(sessions, run_id, "requests.parquet")))
    )
    assert pf.metadata.num_row_groups == 3 and pf.metadata.num_rows == 10


def test_export_limiter_counts_per_client_and_in_all() -> None:
    lim = export_svc.ExportLimiter(per_client=2, total=3)
    assert lim.acquire("a") and lim.acquire("a") and not lim.acquire("a")
    assert lim.acquire("b") and not lim.acquire("c")  # 3 in all
    stream = export_svc.limited(iter([b"x"]), lim, "a")
    assert list(stream) == [b"x"] and lim.acquire("a")  # its slot came back when it ended
    abandoned = export_svc.limited(iter([b"x", b"y"]), lim, "b")
    next(abandoned)
    abandoned.close()  # a client that goes away mid-download frees its slot too
    assert lim.busy("b") == 0


def _hold(port: int, path: str) -> tuple[socket.socket, bytes]:
    """A download that is started and then not read: a tiny receive buffer, so the server's
    stream blocks at once (as a slow client's would). Returns the socket and the head."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    return sock, head


def test_a_third_concurrent_export_of_one_client_is_429(
    live_server: LiveServerFactory, sqlite_url: str
) -> None:
    """Two downloads held open (not read) by one client: the third gets 429; once one
    ends, a new one is served."""
    run_id = _seed(sqlite_url, 1000, 1000)  # 1M events, ~40 MB: more than socket buffers hold
    srv = live_server(sqlite_url)
    path = f"/api/v1/runs/{run_id}/export/events.csv"
    first, head1 = _hold(srv.port, path)
    second, head2 = _hold(srv.port, path)
    try:
        assert head1.startswith(b"HTTP/1.1 200") and head2.startswith(b"HTTP/1.1 200")
        third = httpx.get(srv.url + path, timeout=30)
        assert third.status_code == 429 and "at most 2" in third.text
        assert third.headers.get("retry-after") == "5"
        first.close()  # the client goes away: its slot comes back
        status = 0
        for _ in range(100):
            status = httpx.get(srv.url + path.replace("events.csv", "summary.json")).status_code
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200
    finally:
        first.close()
        second.close()
