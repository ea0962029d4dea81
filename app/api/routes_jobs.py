"""/api/v1/jobs: list and read jobs, and stream a job's progress (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from app.api import convert
from app.api.deps import MAX_OFFSET, Reader, SessionDep, SessionsDep
from app.api.schemas import JobInfo, JobList
from app.protocol.wire import JobKind, JobState
from app.services.errors import NotFound
from app.storage import jobs as job_repo
from app.storage.db import session_scope
from app.storage.jobs import TERMINAL_STATES
from app.storage.jsonsafe import json_safe

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

STREAM_POLL_S = 0.5
KEEPALIVE_S = 15.0


@router.get("")
def list_jobs(
    session: SessionDep,
    _: Reader,
    state: JobState | None = None,
    kind: JobKind | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> JobList:
    """Jobs, newest first."""
    rows = job_repo.list_jobs(session, state=state, kind=kind, limit=limit, offset=offset)
    total = job_repo.count_jobs(session, state=state, kind=kind)
    return JobList(
        items=[convert.job_info(j) for j in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{job_id}")
def get_job(job_id: str, session: SessionDep, _: Reader) -> JobInfo:
    job = job_repo.get_job(session, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}")
    return convert.job_info(job)


def _snapshot(sessions: sessionmaker[Session], job_id: str) -> dict[str, Any] | None:
    with session_scope(sessions) as s:
        job = job_repo.get_job(s, job_id)
        if job is None:
            return None
        return {
            "job_id": job.id,
            "run_id": job.run_id,
            "state": job.state,
            "attempt": job.attempt,
            "cancel_requested": bool(job.cancel_requested),
            "error": job.error,
            "progress": json_safe(job.progress),
        }


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, allow_nan=False)}\n\n"


async def _progress_events(sessions: sessionmaker[Session], job_id: str) -> AsyncIterator[str]:
    last: dict[str, Any] | None = None
    last_sent = time.monotonic()
    while True:
        snap = await anyio.to_thread.run_sync(_snapshot, sessions, job_id)
        if snap is None:
            yield _event("end", {"job_id": job_id, "state": "deleted"})
            return
        if snap != last:
            last = snap
            last_sent = time.monotonic()
            yield _event("progress", snap)
        if snap["state"] in TERMINAL_STATES:
            yield _event("end", {"job_id": job_id, "state": snap["state"]})
            return
        if time.monotonic() - last_sent > KEEPALIVE_S:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(STREAM_POLL_S)


@router.get(
    "/{job_id}/progress/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: progress` with the job's state and progress as JSON "
            "whenever it changes; a final `event: end` after a terminal state",
        }
    },
)
async def stream_progress(job_id: str, sessions: SessionsDep, _: Reader) -> StreamingResponse:
    """Live progress of a job as server-sent events; the stream ends when the job does."""
    if await anyio.to_thread.run_sync(_snapshot, sessions, job_id) is None:
        raise NotFound(f"no job with id {job_id!r}")
    return StreamingResponse(
        _progress_events(sessions, job_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
