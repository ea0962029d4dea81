"""/api/v1/workers and the worker protocol (bodies and semantics: app.protocol.wire)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.api import convert
from app.api.deps import MAX_OFFSET, Reader, SessionDep, SessionsDep, SettingsDep, WorkerCaller
from app.api.schemas import WorkerList
from app.protocol.wire import (
    BatchAck,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    RegisterRequest,
    RegisterResponse,
    ResultBatch,
    ShardReady,
    ShardStart,
)
from app.services import jobs as job_svc
from app.services import shard_jobs as shard_svc
from app.services import sharded_sweeps
from app.services import workers as worker_svc
from app.storage import workers as worker_repo
from app.storage.models import utcnow

router = APIRouter(prefix="/api/v1", tags=["workers"])

LEASE_LOST: dict[int | str, dict[str, Any]] = {
    409: {"description": "lease lost (expired, requeued, finished or deleted)"}
}


def _receipt_ns(request: Request) -> int:
    """When the request reached the app (``AuthFirst`` stamps it before the token check)."""
    t = getattr(request.state, "clock_t2_ns", None)
    return t if isinstance(t, int) else time.time_ns()


@router.get("/workers")
def list_workers(
    session: SessionDep,
    settings: SettingsDep,
    _: Reader,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> WorkerList:
    """Registered workers, most recently seen first, with their capabilities."""
    rows = worker_repo.list_workers(session, limit=limit, offset=offset)
    now = utcnow()
    return WorkerList(
        items=[convert.worker_info(w, now=now, ttl_s=settings.lease_ttl_s) for w in rows],
        total=worker_repo.count_workers(session),
    )


@router.post("/workers/register", tags=["worker protocol"])
def register(
    body: RegisterRequest, session: SessionDep, settings: SettingsDep, caller: WorkerCaller
) -> RegisterResponse:
    """A worker announces itself and its capabilities; the answer carries the timings."""
    return worker_svc.register(session, body, caller, settings)


@router.post("/workers/{worker_id}/lease", tags=["worker protocol"])
def lease(
    worker_id: str,
    body: LeaseRequest,
    request: Request,
    session: SessionDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    caller: WorkerCaller,
) -> LeaseResponse:
    """The oldest queued job this worker can run (requirements matched), or null."""
    worker = worker_svc.own_worker(session, worker_id, caller)
    job_svc.expire_lost_leases(sessions)
    sharded_sweeps.expire_waits(sessions, settings.shard_wait_s)
    job = job_svc.lease(
        session,
        worker,
        body.kinds,
        ttl_s=settings.lease_ttl_s,
        box=request.app.state.secretbox,
        lock=request.app.state.lease_lock,
    )
    return LeaseResponse(job=job)


@router.post("/jobs/{job_id}/heartbeat", tags=["worker protocol"], responses=LEASE_LOST)
def heartbeat(
    job_id: str,
    body: HeartbeatRequest,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    caller: WorkerCaller,
) -> HeartbeatResponse:
    """Renew the lease and report progress; ``cancel: true`` asks the worker to stop. The
    reply carries the server's receipt and send times (the worker's clock offset to it)."""
    t2 = _receipt_ns(request)
    resp = job_svc.heartbeat(session, job_id, body, caller, ttl_s=settings.lease_ttl_s)
    return resp.model_copy(update={"clock_t2_ns": t2, "clock_t3_ns": time.time_ns()})


@router.post("/jobs/{job_id}/shard-ready", tags=["worker protocol"], responses=LEASE_LOST)
def shard_ready(
    job_id: str,
    body: ShardReady,
    request: Request,
    session: SessionDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    caller: WorkerCaller,
) -> ShardStart:
    """A shard of a run dealt over workers is ready; ``start_ns`` (the server's wall clock)
    once every shard is. Not all within ``shard_wait_s``: the run fails and this is a 409.
    The reply carries the server's receipt and send times, as a heartbeat's."""
    t2 = _receipt_ns(request)
    sharded_sweeps.expire_waits(sessions, settings.shard_wait_s)
    resp = shard_svc.ready(session, job_id, body, caller, settings.shard_wait_s)
    return resp.model_copy(update={"clock_t2_ns": t2, "clock_t3_ns": time.time_ns()})


@router.post("/jobs/{job_id}/results", tags=["worker protocol"], responses=LEASE_LOST)
def upload_results(
    job_id: str, body: ResultBatch, session: SessionDep, caller: WorkerCaller
) -> BatchAck:
    """Store one numbered batch of requests; a retried batch is acknowledged as duplicate."""
    return job_svc.ingest_batch(session, job_id, body, caller)


@router.post(
    "/jobs/{job_id}/complete",
    tags=["worker protocol"],
    responses={409: {"description": "lease lost, or batches missing (named in detail)"}},
)
def complete(
    job_id: str,
    body: CompleteRequest,
    session: SessionDep,
    sessions: SessionsDep,
    caller: WorkerCaller,
) -> CompleteResponse:
    """End the job; the run is finalized and its report computed from the uploaded events."""
    return job_svc.complete(session, sessions, job_id, body, caller)
