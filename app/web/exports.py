"""Downloads: the per-request CSV and the report JSON of a run."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from app.services import runs as run_svc
from app.storage import browse
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import views
from app.web.context import principal_of, reads_allowed, sessions_of

router = APIRouter(include_in_schema=False)

CSV_PAGE = 5000
NS_COLUMNS = ("scheduled_ns", "sent_ns", "end_ns", "ttft_ns", "ttfot_ns", "e2e_ns", "tpot_ns")
CSV_HEADER = [
    "idx",
    "warmup",
    "status",
    "error",
    "http_status",
    "scheduled_ms",
    "sent_ms",
    "end_ms",
    "send_lag_ms",
    "input_tokens",
    "output_tokens",
    "token_source",
    "ttft_ms",
    "ttfot_ms",
    "e2el_ms",
    "tpot_ms",
    "n_events",
]


def _ms(v: Any) -> str:
    return "" if v is None else f"{float(v) / 1e6:.6f}"


def csv_row(r: dict[str, Any]) -> list[Any]:
    """One request's CSV row (times in ms, run-relative; blank where unknown)."""
    lag = (
        None
        if r.get("sent_ns") is None or r.get("scheduled_ns") is None
        else r["sent_ns"] - r["scheduled_ns"]
    )
    status = r.get("status")
    return [
        r["idx"],
        int(bool(r.get("warmup"))),
        getattr(status, "value", status),
        r.get("error") or "",
        "" if r.get("http_status") is None else r["http_status"],
        _ms(r.get("scheduled_ns")),
        _ms(r.get("sent_ns")),
        _ms(r.get("end_ns")),
        _ms(lag),
        "" if r.get("input_tokens") is None else r["input_tokens"],
        "" if r.get("output_tokens") is None else r["output_tokens"],
        r.get("token_source") or "",
        _ms(r.get("ttft_ns")),
        _ms(r.get("ttfot_ns")),
        _ms(r.get("e2e_ns")),
        _ms(r.get("tpot_ns")),
        r.get("n_events") or 0,
    ]


def iter_csv(sessions: sessionmaker[Session], run_id: str) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    offset = 0
    while True:
        with session_scope(sessions) as s:
            rows = browse.request_rows(s, run_id, limit=CSV_PAGE, offset=offset)
        for r in rows:
            writer.writerow(csv_row(r))
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
        if len(rows) < CSV_PAGE:
            return
        offset += CSV_PAGE


def _check(request: Request, run_id: str) -> sessionmaker[Session]:
    if not reads_allowed(request, principal_of(request)):
        raise HTTPException(401, "sign in to read runs")
    sessions = sessions_of(request)
    with session_scope(sessions) as s:
        if repo.find_run(s, run_id) is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
    return sessions


@router.get("/runs/{run_id}/requests.csv")
def requests_csv(request: Request, run_id: str) -> StreamingResponse:
    sessions = _check(request, run_id)
    return StreamingResponse(
        iter_csv(sessions, run_id),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{run_id}-requests.csv"'},
    )


@router.get("/runs/{run_id}/report.json")
def report_json(request: Request, run_id: str, profile: str | None = None) -> Response:
    """The report as on the run page (the SLOs in the query, if any, apply)."""
    sessions = _check(request, run_id)
    slos, errors = views.parse_slos(dict(request.query_params.items()))
    if errors:
        raise HTTPException(422, "; ".join(errors.values()))
    prof = (
        profile if profile in ("tokentrace", "vllm", "vllm-legacy", "guidellm", "aiperf") else None
    )
    report = run_svc.run_report(sessions, run_id, slos_ms=slos, profile=prof)
    body = json.dumps(json_safe(report), indent=2, allow_nan=False, default=str)
    return Response(
        body,
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{run_id}-report.json"'},
    )
