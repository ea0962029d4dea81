"""The runs pages: the runs list, a run, its requests table and one request (a run's forms:
``runs_actions``; its live figures: ``runs_live``; its downloads: ``runs_exports``)."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from app.analysis import metric_defs as md
from app.analysis.phases import send_lag_ms_of_row
from app.domain import PHASES, RunStatus
from app.figures import common as fg
from app.figures.scriptjson import plotly_json
from app.services.shard_jobs import waiting_text
from app.storage import compare_repo, request_table, run_columns
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.metric_values import shown_value
from app.web import runs_list as run_list
from app.web import runs_requests as request_query
from app.web import runs_view
from app.web.context import read_gate, render, sessions_of
from app.web.runs_render import render_run_page

router = APIRouter(include_in_schema=False)

KIND_NAMES = fg.KIND_NAMES
REQUESTS_PAGE = 100
EVENTS_TABLE_MAX = 2000
MAX_INDEX = 2**31 - 1  # requests.idx is a 32-bit column: larger indexes exist nowhere


@router.get("/")
def runs_page(request: Request) -> Response:
    """Runs, newest first, a page at a time, filtered; sweep steps folded unless asked."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    q = run_list.parse(_query_dict(request))
    with session_scope(sessions_of(request)) as s:
        total = repo.count_runs(s)
        flt = q.repo_filters()
        matching = repo.count_runs(s, **flt)
        folded = 0 if q.steps else repo.count_runs(s, **(flt | {"sweep_steps": True})) - matching
        step_filters = {k: v for k, v in flt.items() if k != "sweep_steps"}
        folded_sweeps = [] if not folded else repo.sweep_step_counts(s, **step_filters)
        runs = repo.list_runs(s, limit=run_list.PAGE_SIZE, offset=q.offset, **flt)
        jobs = run_columns.active_jobs_by_run(
            s, [r.id for r in runs if str(r.status) in runs_view.ACTIVE_RUN_STATES]
        )
        rows = [runs_view.run_row(r, jobs.get(r.id)) for r in runs]
        sweep_of = compare_repo.sweep_ids_of_runs(s, [r.id for r in runs])
        sources = repo.run_sources(s)
        run_baselines = any(b.run_id is not None for b in compare_repo.list_baselines(s))
    pages = max(1, -(-matching // run_list.PAGE_SIZE))
    return render(
        request,
        "runs.html",
        {
            "nav": "runs",
            "rows": rows,
            "headline_columns": runs_view.headline_columns(),
            "sweep_of": sweep_of,
            "total": total,
            "matching": matching,
            "folded": folded,
            "folded_sweeps": folded_sweeps,
            "q": q,
            "filters": q.values(),
            "filter_errors": q.errors,
            "first": q.offset + 1 if rows else 0,
            "last": q.offset + len(rows),
            "pages": pages,
            "prev_url": q.url(page=q.page - 1) if q.page > 1 else None,
            "next_url": q.url(page=q.page + 1) if q.page < pages else None,
            "steps_url": q.url(steps=not q.steps, page=1),
            "deleted": request.query_params.get("deleted"),
            "statuses": [s.value for s in RunStatus],
            "sources": sources,
            "run_baselines": run_baselines,  # one ticked run compares with a saved baseline
        },
        principal=principal,
        status_code=422 if q.errors else 200,
    )


def _query_dict(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items()}


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    return await render_run_page(request, run_id, principal=principal)


@router.get("/runs/{run_id}/progress.json")
def run_progress(request: Request, run_id: str) -> JSONResponse:
    """The run's status and its job's progress (the page polls this without SSE)."""
    _principal, redirect = read_gate(request)
    if redirect is not None:
        raise HTTPException(401, "sign in to read runs")
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        job = job_repo.job_for_run(s, run_id)
        jv = runs_view.job_view(job)
        waiting = waiting_text(job_repo.shard_jobs(s, run_id))  # "k of K shards leased"
        body = {
            "run_id": run_id,
            "status": str(row.status),
            "job_id": job.id if job else None,
            "state": job.state if job else None,
            "percent": jv.percent if jv else None,
            "text": waiting or (jv.text if jv else None),
            "progress": job.progress if job else None,
        }
    return JSONResponse(body)


@router.get("/runs/{run_id}/requests")
def requests_page(
    request: Request, run_id: str, offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0
) -> Response:
    """The run's requests, 100 a page, sorted and filtered in SQL (``request_query``);
    ``page`` (the pager's jump form, 1 to the last page) sets the offset."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    table = request_query.parse(_query_dict(request))
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        total = repo.count_requests(s, run_id)
        matching = request_table.count_rows(s, run_id, table.query)
        pages = request_query.pager(0, REQUESTS_PAGE, matching).pages
        jump, page_error = request_query.parse_page(request.query_params.get("page"), pages)
        if jump is not None:
            offset = (jump - 1) * REQUESTS_PAGE
        items = request_table.table_rows(s, run_id, table.query, limit=REQUESTS_PAGE, offset=offset)
        name = row.name
    errors = dict(table.errors) | ({"page": page_error} if page_error else {})
    return render(
        request,
        "requests.html",
        {
            "nav": "runs",
            "run_id": run_id,
            "run_name": name,
            "items": items,
            "total": total,
            "matching": matching,
            "offset": offset,
            "page": REQUESTS_PAGE,
            "pager": request_query.pager(offset, REQUESTS_PAGE, matching),
            "table": table,
            "table_errors": errors,
            "sorts": request_table.sort_columns(),
            "statuses": request_query.STATUSES,
            "range_labels": request_query.range_labels(),
            # the table's metric columns: (sort name, heading, SQL column, base units per
            # shown unit, metric key)
            "table_metrics": [
                (m.column_name, request_query.heading(m), m.column, m.per_unit, m.key)
                for m in md.shown("table")
            ],
        },
        principal=principal,
        status_code=422 if errors else 200,
    )


PHASE_TEXT = {
    "queued": ("queue wait", "due → a slot and a connection were free"),
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
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        if repo.find_run(s, run_id) is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        summary = run_columns.request_row(s, run_id, idx) if 0 <= idx <= MAX_INDEX else None
        if summary is None:
            raise HTTPException(404, f"run {run_id!r} has no request {idx}")
        ev = repo.get_request_events(s, run_id, idx)
        summary_only = bool(repo.get_run(s, run_id).summary_only)
        table = request_query.parse(_query_dict(request))  # the table it was opened from
        near = request_table.neighbours(s, run_id, idx, table.query)
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
            "send_lag_ms": send_lag_ms_of_row(summary),
            "user_ttft": shown_value(md.USER_TTFT, summary),
            # the request's metric cards: the table's metrics and any stored without a
            # column of their own (``metric_values``): (metric, value in its unit)
            "metric_cards": [
                (m, shown_value(m, summary))
                for m in md.per_request()
                if "table" in m.views or (m.stored and m.column is None)
            ],
            "events": events,
            "n_events": n,
            "summary_only": summary_only,
            "figure": plotly_json(fig),
            "near": near,
            "table_qs": table.qs(),
            "table_offset": (near.position // REQUESTS_PAGE) * REQUESTS_PAGE
            if near.position is not None
            else (idx // REQUESTS_PAGE) * REQUESTS_PAGE,
        },
        principal=principal,
    )
