"""Read-only pages: runs, run detail, requests, request detail, compare, workers."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from app.analysis.phases import user_ttft_ms_of_row
from app.domain import PHASES, RunStatus
from app.services import runs as run_svc
from app.storage import browse, compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import views as view_repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.models import utcnow
from app.web import figures as fg
from app.web import views, workers_view
from app.web.context import principal_of, reads_allowed, render, sessions_of, settings_of
from app.web.interop_page import add_interop
from app.web.runpage import PROFILE_NAMES, load_run, run_context
from app.web.scriptjson import plotly_json

router = APIRouter(include_in_schema=False)

KIND_NAMES = fg.KIND_NAMES
REQUESTS_PAGE = 100
EVENTS_TABLE_MAX = 2000
QUEUE_SHOWN = 200  # queued jobs listed on the workers page (the count says how many in all)
MAX_INDEX = 2**31 - 1  # requests.idx is a 32-bit column: larger indexes exist nowhere


def _gate(request: Request) -> tuple[Any, Response | None]:
    """The signed-in principal, and a redirect to sign-in when reads need a token."""
    principal = principal_of(request)
    if reads_allowed(request, principal):
        return principal, None
    nxt = request.url.path
    return principal, RedirectResponse(f"/signin?next={nxt}", status_code=303)


def _status_filter(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return RunStatus(value).value
    except ValueError:
        return None


@router.get("/")
def runs_page(
    request: Request,
    model: str | None = None,
    status: str | None = None,
    tag: str | None = None,
    target: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    filters = {
        "model": model or None,
        "status": _status_filter(status),
        "tag": tag or None,
        "target": target or None,
    }
    with session_scope(sessions_of(request)) as s:
        total = repo.count_runs(s)
        runs = repo.list_runs(
            s,
            limit=limit,
            model=filters["model"],
            status=filters["status"],
            tag=filters["tag"],
            target=filters["target"],
        )
        jobs = view_repo.active_jobs_by_run(
            s, [r.id for r in runs if str(r.status) in views.ACTIVE_RUN_STATES]
        )
        rows = [views.run_row(r, jobs.get(r.id)) for r in runs]
        sweep_of = compare_repo.sweep_ids_of_runs(s, [r.id for r in runs])
    return render(
        request,
        "runs.html",
        {
            "nav": "runs",
            "rows": rows,
            "sweep_of": sweep_of,
            "total": total,
            "filters": filters,
            "statuses": [s.value for s in RunStatus],
        },
        principal=principal,
    )


def _query_dict(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items()}


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str, profile: str = "tokentrace") -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    slos, slo_errors = views.parse_slos(_query_dict(request))
    prof = profile if profile in PROFILE_NAMES else "tokentrace"

    def build() -> dict[str, Any]:
        data = load_run(sessions_of(request), run_id)
        ctx = run_context(data, slos_ms=slos, slo_errors=slo_errors, profile=prof)
        add_interop(ctx, sessions_of(request), run_id, data.trace)  # imports, server metrics
        return ctx

    try:
        ctx = await anyio.to_thread.run_sync(build)
    except run_svc.RunNotFound:
        raise HTTPException(404, f"no run with id {run_id!r}") from None
    ctx["nav"] = "runs"
    ctx["slo_query"] = {k: v for k, v in _query_dict(request).items() if k.startswith("slo")}
    return render(request, "run.html", ctx, principal=principal)


@router.get("/runs/{run_id}/progress.json")
def run_progress(request: Request, run_id: str) -> JSONResponse:
    """The run's status and its job's progress (the page polls this without SSE)."""
    _principal, redirect = _gate(request)
    if redirect is not None:
        raise HTTPException(401, "sign in to read runs")
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        job = job_repo.job_for_run(s, run_id)
        jv = views.job_view(job)
        body = {
            "run_id": run_id,
            "status": str(row.status),
            "job_id": job.id if job else None,
            "state": job.state if job else None,
            "percent": jv.percent if jv else None,
            "text": jv.text if jv else None,
            "progress": job.progress if job else None,
        }
    return JSONResponse(body)


@router.get("/runs/{run_id}/requests")
def requests_page(
    request: Request, run_id: str, offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0
) -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        total = repo.count_requests(s, run_id)
        items = browse.request_rows(s, run_id, limit=REQUESTS_PAGE, offset=offset)
        name = row.name
    return render(
        request,
        "requests.html",
        {
            "nav": "runs",
            "run_id": run_id,
            "run_name": name,
            "items": items,
            "total": total,
            "offset": offset,
            "page": REQUESTS_PAGE,
        },
        principal=principal,
    )


PHASE_TEXT = {
    "queued": ("queued", "due → a slot and a connection were free"),
    "connect": ("connect", "TCP connect (none on a reused connection)"),
    "tls": ("TLS", "TLS handshake"),
    "sending": ("sending", "first byte → last byte of the request left"),
    "waiting": ("waiting", "last byte sent → response headers"),
    "first_token": ("first token", "response headers → first token"),
}


def _phase_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's phases for its page; empty when the run recorded none."""
    if r.get("conn_id") is None and r.get("queued_ns") is None:
        return []
    rows = []
    for name in PHASES:
        v = r.get(f"{name}_ns")
        label, what = PHASE_TEXT[name]
        rows.append({"label": label, "what": what, "ms": None if v is None else v / 1e6})
    return rows



@router.get("/runs/{run_id}/requests/{idx}")
def request_page(request: Request, run_id: str, idx: int) -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        if repo.find_run(s, run_id) is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        summary = view_repo.request_row(s, run_id, idx) if 0 <= idx <= MAX_INDEX else None
        if summary is None:
            raise HTTPException(404, f"run {run_id!r} has no request {idx}")
        ev = repo.get_request_events(s, run_id, idx)
        summary_only = bool(repo.get_run(s, run_id).summary_only)
    sent = summary.get("sent_ns")
    t0 = sent if sent is not None else (int(ev.t_ns[0]) if ev.t_ns.shape[0] else 0)
    t_ms = (ev.t_ns - t0) / 1e6
    fig = fg.request_events_figure(t_ms, ev.kind, ev.tokens)
    n = int(ev.t_ns.shape[0])
    shown = min(n, EVENTS_TABLE_MAX)
    gaps = np.diff(ev.t_ns[:shown], prepend=t0) / 1e6 if shown else np.zeros(0)
    events = [
        {
            "i": i,
            "t_ms": float(t_ms[i]),
            "gap_ms": float(gaps[i]),
            "kind": KIND_NAMES.get(int(ev.kind[i]), str(int(ev.kind[i]))),
            "tokens": int(ev.tokens[i]),
            "bytes": int(ev.nbytes[i]),
        }
        for i in range(shown)
    ]
    return render(
        request,
        "request.html",
        {
            "nav": "runs",
            "run_id": run_id,
            "r": summary,
            "phases": _phase_rows(summary),
            "user_ttft_ms": user_ttft_ms_of_row(summary),
            "events": events,
            "n_events": n,
            "summary_only": summary_only,
            "figure": plotly_json(fig),
        },
        principal=principal,
    )


@router.get("/workers")
def workers_page(request: Request) -> Response:
    """Workers (online from their heartbeat age, each one's current job) and the queue of
    jobs waiting for one, with why none takes them (``app.web.workers_view``)."""
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    ttl_s = settings_of(request).lease_ttl_s
    now = utcnow()
    with session_scope(sessions_of(request)) as s:
        rows = worker_repo.list_workers(s, limit=500, offset=0)
        current = {}
        for w in rows:
            job = job_repo.get_job(s, w.current_job_id) if w.current_job_id else None
            if job is not None:
                current[job.id] = job
        queued = job_repo.list_jobs(s, state="queued", kind=None, limit=QUEUE_SHOWN, offset=0)
        n_queued = job_repo.count_jobs(s, state="queued", kind=None)
        workers = workers_view.worker_rows(rows, current, now=now, ttl_s=ttl_s)
        queue = workers_view.queue_rows(queued, rows, now=now, ttl_s=ttl_s)
    return render(
        request,
        "workers.html",
        {
            "nav": "workers",
            "workers": workers,
            "queue": queue,
            "n_queued": n_queued,
            "ttl_s": ttl_s,
        },
        principal=principal,
    )
