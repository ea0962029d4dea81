"""Downloads: the per-request CSV and the report JSON of a run."""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from app.api.downloads import export_response
from app.services import runs as run_svc
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import runs_view
from app.web.context import principal_of, reads_allowed, sessions_of

router = APIRouter(include_in_schema=False)


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
    return export_response(request, sessions, run_id, "requests.csv", principal_of(request))


@router.get("/runs/{run_id}/report.json")
def report_json(request: Request, run_id: str, profile: str | None = None) -> Response:
    """The report as on the run page (the SLOs in the query, if any, apply)."""
    sessions = _check(request, run_id)
    slos, errors = runs_view.parse_slos(dict(request.query_params.items()))
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
