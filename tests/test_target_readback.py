"""What a run keeps of a target's answers, and who may read it (issue 23, item 8: SSRF
read-back). A run pointed at an internal service must not become a way to read it: of an
error answer the status and a short message are kept, never a data line, a header or a
banner; of ``/metrics`` only the series a benchmark reads, bounded; and where reads are
protected, nothing of it (nor of any run) is served without a read token."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute

from app.client.metrics_scraper import MAX_LABEL_CHARS, MAX_SERIES, MetricsScraper
from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.protocol.prometheus import wanted
from app.protocol.wire import WireRequest
from tests.api_support import Api, api_client, record

SECRET = "s3cret-internal-Value"


def _serve(answer: bytes | Callable[[bytes], bytes]) -> Iterator[str]:
    """A loopback server answering every connection with ``answer`` (or what it makes of
    the request's first bytes), then closing."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    req = conn.recv(65536)
                    conn.sendall(answer(req) if callable(answer) else answer)
                except OSError:
                    pass

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()
        t.join(2)


def _errors(url: str) -> list[str]:
    spec = RunSpec(base_url=url, model="m", num_prompts=2, input_len=4, output_len=2,
                   scrape_metrics=False, max_concurrency=1, request_timeout_s=5)  # fmt: skip
    res = run_load_sync(spec, run_tag="rb", handle_sigint=False)
    assert all(r.status is RequestStatus.ERROR for r in res.records)
    return [r.error or "" for r in res.records]


def _http(status: str, ctype: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


LONG = (SECRET + " ") * 200


@pytest.mark.parametrize(
    ("answer", "expect"),
    [
        # a JSON error's message: kept, its first 160 characters
        (_http("403 Forbidden", "application/json", b'{"detail": "%s"}' % LONG.encode()),
         "HTTP 403: " + LONG[:160] + "..."),
        (_http("500 Oops", "application/json", b'{"error": {"message": "%s"}}' % LONG.encode()),
         "HTTP 500: " + LONG[:160] + "..."),
        # a 200 event stream that is not stream JSON: named by size, not quoted
        (_http("200 OK", "text/event-stream", b"data: %s\n\ndata: [DONE]\n\n" % SECRET.encode()),
         "non-JSON data line (21 bytes; not shown)"),
        (_http("200 OK", "text/event-stream", b'data: ["%s"]\n\n' % SECRET.encode()),
         "unexpected data line (JSON list, 25 bytes; not shown)"),
        # an error object in the stream: its message, bounded; nothing else of it
        (_http("200 OK", "text/event-stream",
               b'data: {"error": {"message": "%s", "trace": "%s"}}\n\n'
               % (LONG.encode(), SECRET.encode())),
         "server error in stream: " + LONG[:160] + "..."),
        # not HTTP at all (another service's banner), a bad header line
        (b"SSH-2.0-OpenSSH_" + SECRET.encode() + b"\r\n\r\n",
         "HTTP protocol error: bad status line (37 bytes, not HTTP/1.x; not shown)"),
        (b"HTTP/1.1 200 OK\r\n" + SECRET.encode() + b"\r\n\r\n",
         "HTTP protocol error: bad header line (21 bytes; not shown)"),
    ],
)  # fmt: skip
def test_what_is_kept_of_a_targets_answer(answer: bytes, expect: str) -> None:
    gen = _serve(answer)
    url = next(gen)
    try:
        errors = _errors(url)
    finally:
        gen.close()
    assert errors == [expect, expect]


def test_an_error_answers_code_is_kept_short() -> None:
    from app.client.events import classify

    c = classify(b'{"error": {"message": "busy", "code": "%s"}}' % (b"x" * 500))
    assert c.error == "server error in stream: busy (" + "x" * 40 + "...)"
    c = classify(b'{"error": {"code": 503, "stack": "%s"}}' % SECRET.encode())
    assert c.error == "server error in stream: (no message) (503)"
    c = classify(b'{"error": ["%s"]}' % SECRET.encode())
    assert c.error == "server error in stream: (no message)"


def _metrics_text() -> bytes:
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 3',
        f'vllm:num_requests_running{{model_name="{"y" * (MAX_LABEL_CHARS + 1)}"}} 1',
        f'vllm:num_requests_running{{model_name="m",token="{SECRET}"}} 2',
        f'node_secret_info{{token="{SECRET}"}} 1',  # not a series a benchmark reads
        *(f'vllm:num_requests_waiting{{i="{i}"}} {i}' for i in range(2 * MAX_SERIES)),
    ]
    return "\n".join(lines).encode() + b"\n"


_SSE_OK = b'data: {"choices":[{"delta":{"content":" ok"}}]}\n\ndata: [DONE]\n\n'


@pytest.fixture
def metrics_url() -> Iterator[str]:
    """A target: ``/metrics`` the text above, anything else a valid one-token stream."""
    metrics = _http("200 OK", "text/plain", _metrics_text())
    stream = _http("200 OK", "text/event-stream", _SSE_OK)
    yield from (
        u + "/metrics"
        for u in _serve(lambda req: metrics if b" /metrics " in req[:200] else stream)
    )


def test_metrics_keep_only_the_series_a_benchmark_reads(metrics_url: str) -> None:
    """Unwanted names are not kept; a label over 128 characters and series past 128 are
    dropped, and the run says how many samples it dropped."""
    import time

    sc = MetricsScraper(metrics_url, wanted(), period_s=0.05).start()
    deadline = time.monotonic() + 10
    while sc._result.scrapes < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    res = sc.stop()
    assert res.status == "ok" and res.scrapes >= 2
    keys = {(s.name, tuple(sorted(s.labels.items()))) for s in res.series}
    assert len(keys) == MAX_SERIES
    assert ("vllm:num_requests_running", (("model_name", "m"),)) in keys
    assert ("vllm:num_requests_running", (("model_name", "m"), ("token", SECRET))) in keys
    assert not any(s.name == "node_secret_info" for s in res.series)
    assert all(len(v) <= MAX_LABEL_CHARS for s in res.series for v in s.labels.values())
    waiting = sorted(int(s.labels["i"]) for s in res.series if s.name.endswith("waiting"))
    assert waiting == list(range(MAX_SERIES - 2))  # the first 126 of 256, in their order
    per_scrape = 1 + 2 * MAX_SERIES - (MAX_SERIES - 2)  # the long label + the waiting past
    summary = res.summary()
    assert summary["dropped_samples"] == per_scrape * res.scrapes
    assert SECRET not in str(summary)


# ---------------------------------------------------------------- the read gate


def _get_routes(api: Api) -> list[str]:
    """Every GET path the app serves (pages and API), parameters filled in later."""

    def walk(routes: list[Any]) -> Iterator[Any]:
        for r in routes:
            if (sub := getattr(r, "original_router", None)) is not None:
                yield from walk(sub.routes)
            else:
                yield r

    out = []
    for r in walk(api.app.routes):
        methods = getattr(r, "methods", None) or set()
        if "GET" in methods and isinstance(getattr(r, "path", None), str):
            out.append(r.path)
    assert sum(1 for r in walk(api.app.routes) if isinstance(r, APIRoute)) >= 30
    return sorted(set(out))


def _stored_run(api: Api) -> tuple[str, str]:
    """A run whose requests failed with the target's "secret" error message and whose
    stored server metrics carry it in a label."""
    out = api.create_run(num_prompts=2)
    job = api.lease(api.register())
    assert job is not None
    reqs = []
    for i in range(2):
        w = WireRequest.from_record(record(i, ok=False)).model_dump(mode="json")
        w["error"] = f"HTTP 500: {SECRET}"
        reqs.append(w)
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": reqs}
    assert api.post_job(out["job_id"], "results", body).status_code == 200
    series = [{"name": "vllm:num_requests_running", "labels": {"model_name": SECRET},
               "kind": "gauge", "t_ns": [0, 1_000_000_000], "values": [1.0, 2.0]}]  # fmt: skip
    done = {"lease_id": job["lease_id"], "status": "succeeded", "total_batches": 1,
            "server_metrics": series}  # fmt: skip
    assert api.post_job(out["job_id"], "complete", done).status_code == 200
    return out["run_id"], out["job_id"]


def test_nothing_of_a_target_is_served_without_a_read_token(sqlite_url: str) -> None:
    """With ``auth_reads``, every GET route (API, pages, exports, comparisons), its
    parameters the stored run's, answers without a token with no byte of the target's
    error text or of its server metrics; with a read token the run's own routes show both
    (the check can fail)."""
    with api_client(sqlite_url, auth_reads=True) as api:
        run_id, job_id = _stored_run(api)
        ids = {"run_id": run_id, "job_id": job_id, "index": "0", "what": "requests.json"}
        leaked = []
        for path in _get_routes(api):
            url = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: ids.get(m.group(1), run_id), path)
            url += f"?ids={run_id}&ids={run_id}"  # the comparisons' runs (ignored elsewhere)
            r = api.client.get(url, follow_redirects=False)
            assert r.status_code < 500, (url, r.status_code)
            if SECRET in r.text:
                leaked.append((url, r.status_code))
        assert leaked == []
        h = api.h(api.read)
        r = api.client.get(f"/api/v1/runs/{run_id}/server-metrics", headers=h)
        assert r.status_code == 200 and SECRET in r.text
        r = api.client.get(f"/api/v1/runs/{run_id}/export/requests.json", headers=h)
        assert r.status_code == 200 and SECRET in r.text
        r = api.client.get(f"/api/v1/runs/{run_id}/server-metrics")
        assert r.status_code == 401


def test_the_run_page_says_what_the_scrape_dropped(tmp_path: Any, metrics_url: str) -> None:
    """The scrape's dropped samples reach the run page: 131 a scrape here (the long label,
    and the 130 series of 256 past the 128 kept) times the scrapes the page states."""
    from fastapi.testclient import TestClient

    from app.services.runs import execute_bench, open_database
    from tests.web_support import web_app

    url = f"sqlite:///{tmp_path / 'scrape.db'}"
    spec = RunSpec(base_url=metrics_url.removesuffix("/metrics"), model="m", num_prompts=2,
                   input_len=4, output_len=2, max_concurrency=1, request_timeout_s=5)  # fmt: skip
    out = execute_bench(spec, sessions=open_database(url))
    assert out.run_id is not None
    with TestClient(web_app(url)) as client:
        page = client.get(f"/runs/{out.run_id}").text
    m = re.search(r": ok \((\d+) scrapes\); (\d+) samples not kept", page)
    assert m is not None, page[page.find("server-metrics-status") :][:400]
    assert int(m.group(2)) == (1 + 2 * MAX_SERIES - (MAX_SERIES - 2)) * int(m.group(1))
    assert SECRET not in page.split("server-metrics-status", 1)[1].split("</p>", 1)[0]
