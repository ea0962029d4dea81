"""Workers: registration, requirement matching and job ownership."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.protocol.wire import JobRequirements, RegisterRequest, RegisterResponse, WorkerCapabilities
from app.services.auth import Principal
from app.services.errors import Forbidden, NotFound
from app.settings import Settings
from app.storage import workers as worker_repo
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, Worker


def register(
    session: Session, req: RegisterRequest, principal: Principal, settings: Settings
) -> RegisterResponse:
    caps = req.capabilities
    row = worker_repo.insert_worker(
        session,
        name=req.name,
        hostname=caps.hostname,
        capabilities=json_safe(caps.model_dump(mode="json")),
        labels=dict(caps.labels),
        token_id=principal.token_id,
    )
    return RegisterResponse(
        worker_id=row.id,
        lease_ttl_s=settings.lease_ttl_s,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        poll_interval_s=settings.poll_interval_s,
    )


def own_worker(session: Session, worker_id: str, principal: Principal) -> Worker:
    """The worker, if the caller's token registered it (admins may act for any worker)."""
    row = worker_repo.get_worker(session, worker_id)
    if row is None:
        raise NotFound(f"no worker with id {worker_id!r}: register first")
    if not principal.is_admin and row.token_id != principal.token_id:
        raise Forbidden(f"worker {worker_id!r} was registered with another token")
    return row


def check_job_owner(session: Session, job: Job, principal: Principal) -> None:
    """A worker token may only act on jobs leased to a worker it registered."""
    if principal.is_admin:
        return
    worker = worker_repo.get_worker(session, job.worker_id) if job.worker_id else None
    if worker is None or worker.token_id != principal.token_id:
        raise Forbidden(f"job {job.id!r} is not leased to a worker of this token")


def matches(req: JobRequirements, caps: WorkerCapabilities) -> bool:
    """Every label equal; a GPU whose name contains ``gpu_name`` (case-insensitive) and has at
    least ``min_gpu_memory_mb`` (the same GPU when both are given)."""
    if any(caps.labels.get(k) != v for k, v in req.labels.items()):
        return False
    if req.gpu_name is None and req.min_gpu_memory_mb is None:
        return True
    want = req.gpu_name.lower() if req.gpu_name else None
    for gpu in caps.gpus:
        if want is not None and want not in gpu.name.lower():
            continue
        if req.min_gpu_memory_mb is not None and (gpu.memory_total_mb or 0) < req.min_gpu_memory_mb:
            continue
        return True
    return False


__all__ = ["check_job_owner", "matches", "own_worker", "register"]
