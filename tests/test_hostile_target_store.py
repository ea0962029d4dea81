"""What a hostile target says is stored faithfully and never breaks a run's page (issue 23,
items 3 and 4), on SQLite and PostgreSQL, through the CLI path and through REST + worker.

A loopback target answers every request badly in its own way: an HTTP 400 whose JSON error
message holds U+0000, a stream whose error event holds U+0000, or a good stream whose usage
reports ``cached_tokens`` of 2^63-1; its ``/metrics`` has label values with an escaped line
feed (valid exposition format), a raw NUL, a quote and a backslash, and a UTF-8 label name;
its ``/v1/models`` names a model with a NUL. Before the fix PostgreSQL's COPY refused every
batch (0 of 10 requests stored), the label set read back as a 500, and SQLite's SUM of the
cached counts overflowed (a 503 on every read of the run page, for good)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, text, update

from app.api.app import create_app
from app.client.spec import RunSpec
from app.protocol.wire import WireRequest
from app.services.runs import execute_bench, open_database
from app.settings import Settings
from app.storage import interop as interop_repo
from app.storage import turn_rows
from app.storage.models import Job, Request, Run
from app.storage.models_interop import ServerMetricSample
from app.storage.target_text import MARK, decode, encode
from tests.api_support import Api, api_client, record, wire
from tests.live_server import LiveServerFactory, make_token
from tests.worker_helpers import api as api_of
from tests.worker_helpers import submit, wait_job

pytestmark = pytest.mark.timeout(120)

N = 10
BIG = 2**63 - 1
MODEL = "hostile"
LABELS = {
    "model_name": "line1\nline2",
    "raw": "nul\x00here",
    "q": 'a"b\\c',
    "dotted.name": "utf8 ok",
}
METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="line1\\nline2",raw="nul\x00here",q="a\\"b\\\\c",'
    '"dotted.name"="utf8 ok"} 1\n'
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{model_name="line1\\nline2"} 10\n'
)


def message(n: int) -> str:
    """What the target says when request ``n`` fails (see ``Hostile.answer``)."""
    return f"bad\x00input {n}" if n % 3 == 0 else f"stream\x00broke {n}"


def _sse(*objs: object) -> bytes:
    events = [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs]
    return b"".join(events) + b"data: [DONE]\n\n"


def _chunk(content: str) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    return {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}


@dataclass
class Hostile:
    """The target: the ``n``-th request to arrive gets answer ``n % 3``: 0 an HTTP 400 with
    a NUL in its message, 1 a stream whose error event holds a NUL, 2 a good stream
    reporting ``cached_tokens`` of 2^63-1 (of 10 requests: 4, 3 and 3)."""

    seen: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self) -> tuple[int, str, bytes]:
        with self.lock:
            n = len(self.seen)
            self.seen.append(n)
        if n % 3 == 0:
            body = json.dumps({"error": {"message": message(n), "type": "invalid_request"}})
            return 400, "application/json", body.encode()
        if n % 3 == 1:
            err = {"error": {"message": message(n), "code": 500}}
            return 200, "text/event-stream", _sse(_chunk("a"), err)
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                 "prompt_tokens_details": {"cached_tokens": BIG}}  # fmt: skip
        last = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                "usage": usage}  # fmt: skip
        return 200, "text/event-stream", _sse(_chunk("a"), _chunk("b"), _chunk("c"), last)


def _handler(target: Hostile) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, "text/plain; version=0.0.4", METRICS.encode())
            elif self.path.startswith("/v1/models"):
                models = {"data": [{"id": MODEL}, {"id": "evil\x00twin"}]}
                self._send(200, "application/json", json.dumps(models).encode())
            else:
                self._send(404, "application/json", b'{"error": "no route"}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self._send(*target.answer())

    return H


@pytest.fixture
def hostile() -> Iterator[tuple[str, Hostile]]:
    target = Hostile()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(target))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", target
    finally:
        srv.shutdown()
        srv.server_close()


def _spec(url: str) -> dict[str, Any]:
    return {"base_url": url, "model": MODEL, "num_prompts": N, "max_concurrency": 2,
            "input_len": 8, "output_len": 3, "request_timeout_s": 10.0,
            "max_error_rate": 1.0}  # fmt: skip


def _check_run(c: Any, run_id: str, target: Hostile) -> None:
    """Over the API and the pages (``c`` an httpx client of the dashboard, a read token
    set): every request the target answered is stored with its message, NUL included; the
    run's page, report, requests, exports and server metrics answer; the labels read back
    exactly."""
    assert len(target.seen) == N
    rows = c.get(f"/api/v1/runs/{run_id}/requests", params={"limit": 100}).json()["items"]
    assert sorted(r["index"] for r in rows) == list(range(N))
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        if r["status"] != "ok":
            assert r["error"] is not None
            assert "bad\x00input " in r["error"] or "stream\x00broke " in r["error"], r
            assert not r["error"].startswith(MARK)  # shown as the target said it
    assert by_status.get("ok") == 3 and sum(by_status.values()) == N, by_status
    errors = [r["error"] for r in rows if r["error"]]
    assert sum("bad\x00input " in e for e in errors) == 4, errors
    assert sum("stream\x00broke " in e for e in errors) == 3, errors
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/requests", f"/runs/{run_id}/requests/0",
                 f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/export/requests.jsonl",
                 f"/api/v1/runs/{run_id}/export/requests.csv", "/?tag=x", "/"):  # fmt: skip
        r = c.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    exported = c.get(f"/api/v1/runs/{run_id}/export/requests.jsonl").text.splitlines()
    errors = {json.loads(line)["error"] for line in exported if line.strip()} - {None}
    assert any("bad\x00input" in e for e in errors), errors
    series = c.get(f"/api/v1/runs/{run_id}/server-metrics").json()
    running = [s for s in series if s["name"] == "vllm:num_requests_running"]
    assert running and running[0]["labels"] == LABELS, running
    prompt = [s for s in series if s["name"] == "vllm:prompt_tokens_total"]
    assert prompt and prompt[0]["labels"] == {"model_name": "line1\nline2"}


def _cached_sums(db_url: str, run_id: str) -> tuple[int, int, int]:
    sessions = open_database(db_url)
    try:
        with sessions() as s:
            return turn_rows.cached_prompt_sums(s, run_id)
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()


def test_cli_path_stores_every_answer_faithfully(db_url: str, hostile: tuple[str, Hostile]) -> None:
    url, target = hostile
    sessions = open_database(db_url)
    try:
        out = execute_bench(RunSpec.model_validate(_spec(url)), sessions=sessions, name="cli")
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()
    assert out.run_id is not None
    # 3 successful requests each said cached_tokens = 2^63-1 over 10 prompt tokens
    assert _cached_sums(db_url, out.run_id) == (3, 3 * BIG, 30)
    read = make_token(db_url, "read")
    app = create_app(Settings(database_url=db_url, local_worker=False))
    with TestClient(app, headers={"Authorization": f"Bearer {read}"}) as c:
        _check_run(c, out.run_id, target)


@pytest.mark.slow
def test_rest_and_worker_path_stores_every_answer_faithfully(
    db_url: str, hostile: tuple[str, Hostile], live_server: LiveServerFactory
) -> None:
    """The issue's run: launched over REST, run by the server's worker, 10 of 10 stored."""
    url, target = hostile
    srv = live_server(db_url, local_worker=True)
    with api_of(srv) as c:
        run_id, job_id = submit(c, _spec(url))
        done = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), timeout_s=60)
    assert done["state"] == "succeeded", (done, srv.log_tail())
    assert _cached_sums(db_url, run_id) == (3, 3 * BIG, 30)
    import httpx

    read = srv.create_token("read")
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {read}"},
                      timeout=30, trust_env=False) as c:  # fmt: skip
        _check_run(c, run_id, target)


# ------------------------------------------------------------------ the worker protocol


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _leased(api: Api) -> tuple[str, str, str]:
    out = api.create_run()
    job = api.lease(api.register())
    assert job is not None
    return out["run_id"], out["job_id"], job["lease_id"]


def test_a_batch_with_nul_errors_is_stored_whole_and_reads_back_exactly(api: Api) -> None:
    rid, jid, lid = _leased(api)
    said = ["bad\x00input", "\x00", "\ufdd0starts like an escaped one", "back\\slash\x00\\0"]
    recs = [record(i, ok=False) for i in range(len(said))]
    for rec, msg in zip(recs, said, strict=True):
        rec.error = msg
    reqs = [WireRequest.from_record(r).model_dump(mode="json") for r in recs]
    body = {"lease_id": lid, "batch_no": 0, "requests": reqs}
    assert api.post_job(jid, "results", body).json()["accepted"] == len(said)
    done = {"lease_id": lid, "status": "failed", "error": "it said \x00", "total_batches": 1}
    assert api.post_job(jid, "complete", done).status_code == 200
    items = api.client.get(f"/api/v1/runs/{rid}/requests", headers=api.h(api.read)).json()
    assert [r["error"] for r in items["items"]] == said
    job = api.client.get(f"/api/v1/jobs/{jid}", headers=api.h(api.read)).json()
    assert job["error"] == "it said \x00"
    with api.sessions() as s:  # stored escaped (PostgreSQL's text cannot hold NUL)
        stored = s.execute(text("SELECT error FROM requests ORDER BY idx")).scalars().all()
    assert stored == [encode(m) for m in said] and [decode(x) for x in stored] == said
    assert stored[0] == MARK + "bad\\0input"


@pytest.mark.parametrize(
    "field", ["queued_ns", "connect_ns", "tls_ns", "sending_ns", "waiting_ns", "first_token_ns"]
)
def test_phase_fields_past_int64_are_422_naming_the_field(api: Api, field: str) -> None:
    """They were a 500 on SQLite (OverflowError binding the parameter)."""
    _, jid, lid = _leased(api)
    raw = TestClient(api.app, raise_server_exceptions=False)
    for value in (2**63, -(2**63) - 1, 10**30):
        req = wire([0])[0] | {field: value}
        body = {"lease_id": lid, "batch_no": 0, "requests": [req]}
        r = raw.post(f"/api/v1/jobs/{jid}/results", json=body, headers=api.h(api.worker))
        assert r.status_code == 422, (value, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"] == ["body", "requests", 0, field]
    for name, value in (("conn_id", 2**31), ("retries", 2**31), ("conn_id", -1)):
        req = wire([0])[0] | {name: value}
        body = {"lease_id": lid, "batch_no": 0, "requests": [req]}
        r = raw.post(f"/api/v1/jobs/{jid}/results", json=body, headers=api.h(api.worker))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == name, r.text
    ok = {"lease_id": lid, "batch_no": 0, "requests": [wire([0])[0] | {field: 2**63 - 1}]}
    assert api.post_job(jid, "results", ok).json()["accepted"] == 1


def test_server_metric_labels_with_line_feeds_and_nul_read_back(api: Api) -> None:
    rid, jid, lid = _leased(api)
    batch = {"lease_id": lid, "batch_no": 0, "requests": wire([0])}
    assert api.post_job(jid, "results", batch).status_code == 200
    series = [{"name": "vllm:num_requests_running", "labels": LABELS | {"k\nz": "\x00"},
               "kind": "gauge", "t_ns": [0, 5], "values": [1.0, 2.0]}]  # fmt: skip
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 1, "server_metrics": series}
    assert api.post_job(jid, "complete", done).status_code == 200
    got = api.client.get(f"/api/v1/runs/{rid}/server-metrics", headers=api.h(api.read)).json()
    assert got[0]["labels"] == LABELS | {"k\nz": "\x00"} and got[0]["values"] == [1.0, 2.0]
    assert api.client.get(f"/runs/{rid}").status_code == 200


# ------------------------------------------------------------------ data already stored


def test_a_run_page_survives_what_older_versions_stored(api: Api) -> None:
    """Rows written before the fix, as the old code wrote them: cached counts of 2^63-1
    (SQLite's SUM raised "integer overflow": a 503 on every read, for good), a label set
    with a raw line feed (unreadable: a 500), a label name the old code did not quote, and
    (PostgreSQL accepted ``\\u0000`` in JSON) a tag holding NUL (every tag filter failed
    casting the tags to jsonb)."""
    rid, jid, lid = _leased(api)
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1, 2])}
    assert api.post_job(jid, "results", body).status_code == 200
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 1}
    assert api.post_job(jid, "complete", done).status_code == 200
    with api.sessions() as s:
        s.execute(update(Request).where(Request.run_id == rid).values(cached_prompt_tokens=BIG))
        s.execute(
            insert(ServerMetricSample),
            [
                {"run_id": rid, "name": "vllm:num_requests_running",
                 "labels": 'model_name="a\nb"', "kind": "gauge", "t_ns": 0, "value": 1.0},
                {"run_id": rid, "name": "vllm:num_requests_waiting",
                 "labels": 'a b="1"', "kind": "gauge", "t_ns": 0, "value": 2.0},
            ],
        )  # fmt: skip
        s.execute(text("UPDATE runs SET tags = :t WHERE id = :r"),
                  {"t": '["old\\u0000tag", "x"]', "r": rid})  # fmt: skip
        s.commit()
    raw = TestClient(api.app, raise_server_exceptions=False)
    for path in (f"/runs/{rid}", "/?tag=x", "/api/v1/runs?tag=x"):
        r = raw.get(path, headers=api.h(api.read))
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    listed = raw.get("/api/v1/runs", params={"tag": "x"}, headers=api.h(api.read)).json()
    assert [x["id"] for x in listed["items"]] == [rid]
    got = raw.get(f"/api/v1/runs/{rid}/server-metrics", headers=api.h(api.read)).json()
    assert {s["name"]: s["labels"] for s in got} == {
        "vllm:num_requests_running": {"model_name": "a\nb"},
        "vllm:num_requests_waiting": {"labels": 'a b="1"'},  # unreadable: shown as stored
    }
    with api.sessions() as s:
        n, cached, prompts = turn_rows.cached_prompt_sums(s, rid)
    assert (n, cached, prompts) == (3, 3 * BIG, 3 * 16)  # 16: the records' input_tokens
    with api.sessions() as s:
        assert s.scalar(select(Run.tags).where(Run.id == rid)) == ["old\x00tag", "x"]
        assert s.scalar(select(Job.state).where(Job.id == jid)) == "succeeded"
        assert interop_repo.count_server_samples(s, rid) == 2
