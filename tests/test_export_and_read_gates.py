"""CSV exports cannot carry spreadsheet formulas, and the server's own metrics and API
description follow ``TOKENTRACE_AUTH_READS`` (issue 14, item 15).

A request's ``error`` text comes from the target (an HTTP error body) or a worker: a cell
``=HYPERLINK(...)`` opened in a spreadsheet runs as a formula. Text cells starting with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return get a leading ``'``; numbers, negative
ones included, stay numbers."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import pytest

from app.protocol.wire import WireRequest
from tests.api_support import Api, api_client, record
from tests.web_support import sign_in

FORMULAS = ['=HYPERLINK("http://evil","x")', "+1+2", "-3+cmd|' /C calc'!A0", "@SUM(A1)"]


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


def _run_with_hostile_errors(api: Api) -> str:
    out = api.create_run(num_prompts=6)
    job = api.lease(api.register())
    assert job is not None
    reqs: list[dict[str, Any]] = []
    for i, text in enumerate([*FORMULAS, "\tTAB", "plain error"]):
        w = WireRequest.from_record(record(i, ok=False)).model_dump(mode="json")
        w["error"] = text
        reqs.append(w)
    # request 5 was sent 2 ms before it was scheduled, without a queue wait: a negative
    # send lag (a number)
    reqs[5]["scheduled_ns"] = reqs[5]["sent_ns"] + 2_000_000
    reqs[5]["queued_ns"] = 0
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": reqs}
    assert api.post_job(out["job_id"], "results", body).json()["accepted"] == 6
    done = {"lease_id": job["lease_id"], "status": "succeeded", "total_batches": 1}
    assert api.post_job(out["job_id"], "complete", done).status_code == 200
    run_id: str = out["run_id"]
    return run_id


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("where", ["page", "api"])
def test_csv_export_neutralises_formulas_and_keeps_negative_numbers(api: Api, where: str) -> None:
    rid = _run_with_hostile_errors(api)
    url = (
        f"/runs/{rid}/requests.csv"
        if where == "page"
        else (f"/api/v1/runs/{rid}/export/requests.csv")
    )
    r = api.client.get(url)
    assert r.status_code == 200, r.text
    rows = _rows(r.text)
    errors = [row["error"] for row in rows]
    assert errors == [*("'" + f for f in FORMULAS), "'\tTAB", "plain error"]
    assert rows[5]["send_lag_ms"] == "-2.0"  # a negative number stays a number
    assert all(not e.startswith(("=", "+", "-", "@", "\t", "\r")) for e in errors)
    assert rows[0]["status"] == "error" and rows[0]["http_status"] == "500"


def test_events_csv_and_json_exports(api: Api) -> None:
    rid = _run_with_hostile_errors(api)
    r = api.client.get(f"/api/v1/runs/{rid}/export/events.csv")
    assert r.status_code == 200
    r = api.client.get(f"/api/v1/runs/{rid}/export/requests.json")
    assert r.json()[0]["error"] == FORMULAS[0]  # JSON is data, not a spreadsheet: unchanged


# ------------------------------------------------------------ metrics and API docs

GATED = ["/metrics", "/openapi.json", "/docs"]


@pytest.fixture
def protected(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url, auth_reads=True) as a:
        yield a


@pytest.mark.parametrize("path", GATED)
def test_metrics_and_api_docs_need_a_read_token_when_reads_are_protected(
    protected: Api, path: str
) -> None:
    a = protected
    r = a.client.get(path)
    assert r.status_code == 401, (path, r.status_code)
    assert "tokentrace_http_request" not in r.text and '"paths"' not in r.text  # nothing leaks
    assert a.client.get(path, headers=a.h("tt_not_a_token")).status_code == 401
    assert a.client.get(path, headers=a.h(a.read)).status_code == 200
    sign_in(a.client, a.read)  # the dashboard's sign-in session cookie
    try:
        assert a.client.get(path).status_code == 200
    finally:
        a.client.cookies.clear()


@pytest.mark.parametrize("path", GATED)
def test_metrics_and_api_docs_are_open_when_reads_are(api: Api, path: str) -> None:
    assert api.client.get(path).status_code == 200
