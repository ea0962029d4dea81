"""The workers page: each worker online or not (its heartbeat's age), what it runs, and the
queue of jobs waiting for one, with why none takes them (view model: ``workers_view``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.storage import jobs as job_repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.models import utcnow
from app.web import workers_view
from app.web.context import read_gate, render, sessions_of, settings_of

router = APIRouter(include_in_schema=False)
QUEUE_SHOWN = 200  # queued jobs listed (the count says how many in all)


@router.get("/workers")
def workers_page(request: Request) -> Response:
    """Workers (online from their heartbeat age, each one's current job) and the queue of
    jobs waiting for one, with why none takes them (``app.web.workers_view``)."""
    principal, redirect = read_gate(request)
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
