"""/api/v1/runs: create (queues a bench job), list, read, browse requests, cancel, delete,
tag and annotate runs."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Query, status
from sqlalchemy.orm import Session

from app.analysis.profiles import Profile
from app.api import convert
from app.api.deps import (
    MAX_OFFSET,
    Reader,
    Runner,
    SecretBoxDep,
    SessionDep,
    SessionsDep,
    SettingsDep,
)
from app.api.schemas import (
    CancelResponse,
    DeleteResponse,
    NoteBody,
    NoteResponse,
    RequestEvents,
    RequestPage,
    RunCreate,
    RunCreated,
    RunDetail,
    RunList,
    TagsBody,
    TagsResponse,
)
from app.domain import EventKind, RunStatus
from app.services import bench_jobs, targets
from app.services import jobs as job_svc
from app.services import series as series_svc
from app.services.errors import Invalid, NotFound
from app.services.runs import RunNotFound, run_report
from app.storage import browse
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.jsonsafe import json_safe
from app.storage.models import Run

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])

_KIND_NAMES = {int(k): k.name.lower() for k in EventKind}


def _run(session: Session, run_id: str) -> Run:
    run = repo.find_run(session, run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id!r}")
    return run


@router.post("", status_code=status.HTTP_201_CREATED)
def create_run(
    body: RunCreate, session: SessionDep, settings: SettingsDep, box: SecretBoxDep, _: Runner
) -> RunCreated:
    """Queue a benchmark: creates the run (status queued) and its bench job together.
    422 naming ``base_url`` when the operator's target allow-list refuses it."""
    targets.check_run_targets(body.base_url, body.metrics_url, settings, body.base_urls)
    run_id, job_id = bench_jobs.create_bench_run(
        session,
        body.to_spec(),
        requirements=body.requirements,
        name=body.name,
        max_attempts=settings.max_attempts,
        box=box,
    )
    if body.series:  # pending in the series until it finishes
        series_svc.join_run(session, body.series, run_id)
    return RunCreated(run_id=run_id, job_id=job_id)


@router.get("")
def list_runs(
    session: SessionDep,
    _: Reader,
    model: str | None = None,
    target: Annotated[str | None, Query(description="the target base URL")] = None,
    tag: str | None = None,
    status: RunStatus | None = None,
    since: Annotated[dt.datetime | None, Query(description="created at or after")] = None,
    until: Annotated[dt.datetime | None, Query(description="created before")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> RunList:
    """Runs, newest first, filtered and paginated."""

    def aware(v: dt.datetime | None, name: str) -> dt.datetime | None:
        if v is not None and v.tzinfo is None:
            raise Invalid(
                f"{name} needs a timezone, e.g. 2026-01-31T00:00:00Z", loc=("query", name)
            )
        return v

    filters = {
        "model": model,
        "target": target,
        "tag": tag,
        "status": status,
        "since": aware(since, "since"),
        "until": aware(until, "until"),
    }
    rows = repo.list_runs(session, limit=limit, offset=offset, **filters)  # type: ignore[arg-type]
    total = repo.count_runs(session, **filters)  # type: ignore[arg-type]
    return RunList(
        items=[convert.run_summary(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{run_id}")
def get_run(
    run_id: str,
    session: SessionDep,
    sessions: SessionsDep,
    _: Reader,
    profile: Profile | None = None,
) -> RunDetail:
    """The run, its job, and its report (summary metrics; ``profile``: another tool's view)."""
    run = _run(session, run_id)
    job = job_repo.job_for_run(session, run_id)
    try:
        report = run_report(sessions, run_id, profile=profile)
    except RunNotFound:
        raise NotFound(f"no run with id {run_id!r}") from None
    return RunDetail(
        run=convert.run_summary(run),
        job=convert.job_info(job) if job is not None else None,
        report=json_safe(report),
    )


@router.get("/{run_id}/requests")
def list_requests(
    run_id: str,
    session: SessionDep,
    _: Reader,
    limit: Annotated[int, Query(ge=1, le=5000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> RequestPage:
    """The per-request table (summary columns in ms), ordered by index."""
    _run(session, run_id)
    rows = browse.request_rows(session, run_id, limit=limit, offset=offset)
    total = repo.count_requests(session, run_id)
    return RequestPage(
        items=[convert.request_row(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{run_id}/requests/{index}/events")
def request_events(
    run_id: str,
    index: Annotated[int, Path(ge=0, le=MAX_OFFSET)],
    session: SessionDep,
    _: Reader,
) -> RequestEvents:
    """Every event of one request: arrival time, bytes, kind and tokens."""
    _run(session, run_id)
    exists, sent_ns = browse.request_sent_ns(session, run_id, index)
    if not exists:
        raise NotFound(f"run {run_id!r} has no request with index {index}")
    ev = repo.get_request_events(session, run_id, index)
    return RequestEvents(
        run_id=run_id,
        index=index,
        sent_ms=None if sent_ns is None else sent_ns / 1e6,
        t_ms=(np.asarray(ev.t_ns, np.float64) / 1e6).tolist(),
        bytes=np.asarray(ev.nbytes).tolist(),
        kinds=[_KIND_NAMES.get(int(k), str(int(k))) for k in np.asarray(ev.kind).tolist()],
        tokens=np.asarray(ev.tokens).tolist(),
    )


@router.post("/{run_id}/cancel")
def cancel_run(run_id: str, session: SessionDep, _: Runner) -> CancelResponse:
    """Queued: cancelled now. On a worker: it stops at its next heartbeat."""
    r = job_svc.cancel_run(session, run_id)
    return CancelResponse(
        run_id=r.run_id, job_id=r.job_id, state=r.state, cancel_requested=r.cancel_requested
    )


@router.delete("/{run_id}")
def delete_run(
    run_id: str,
    session: SessionDep,
    _: Runner,
    force: Annotated[bool, Query(description="delete even while a worker runs it")] = False,
) -> DeleteResponse:
    """Delete the run with its requests and job (409 while a worker runs it, unless force)."""
    job_svc.delete_run(session, run_id, force=force)
    return DeleteResponse(run_id=run_id, deleted=True)


@router.put("/{run_id}/tags")
def set_tags(run_id: str, body: TagsBody, session: SessionDep, _: Runner) -> TagsResponse:
    """Replace the run's tags (trimmed, de-duplicated)."""
    _run(session, run_id)
    try:
        tags = repo.set_tags(session, run_id, body.tags)
    except (ValueError, TypeError) as e:
        raise Invalid(str(e), loc=("body", "tags")) from None
    return TagsResponse(run_id=run_id, tags=tags)


@router.put("/{run_id}/note")
def set_note(run_id: str, body: NoteBody, session: SessionDep, _: Runner) -> NoteResponse:
    """Replace the run's free-text note (null clears it)."""
    _run(session, run_id)
    repo.set_note(session, run_id, body.note)
    return NoteResponse(run_id=run_id, note=body.note)
