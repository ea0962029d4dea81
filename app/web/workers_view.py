"""The workers page's rows: each worker online or offline from its heartbeat age, what it is
running (its leased job -> the run, sweep or probe page), and the queue of jobs waiting for
a worker with why none takes them when the reason is known (no online worker matches its
requirements). Pure: rows in, view dicts out."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.protocol.wire import JobRequirements, WorkerCapabilities
from app.services.workers import matches
from app.storage.models import Job, Worker


@dataclass(frozen=True, slots=True)
class JobLink:
    job_id: str
    kind: str
    href: str | None  # the run, sweep or probe page
    label: str


def job_link(job: Job) -> JobLink:
    spec = job.spec or {}
    if job.kind == "sweep" and spec.get("sweep_id"):
        sid = str(spec["sweep_id"])
        return JobLink(job.id, job.kind, f"/sweeps/{sid}", f"sweep {sid}")
    if job.kind == "probe" and spec.get("probe_id"):
        pid = str(spec["probe_id"])
        return JobLink(job.id, job.kind, f"/probes/{pid}", f"probe {pid}")
    if job.run_id:
        return JobLink(job.id, job.kind, f"/runs/{job.run_id}", f"run {job.run_id}")
    return JobLink(job.id, job.kind, None, f"{job.kind} job {job.id}")


def age_text(seconds: float) -> str:
    """A heartbeat age: "12 s ago", "5 min ago", "3 h ago", "2 d ago"."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def _caps(w: Worker) -> WorkerCapabilities | None:
    data = dict(w.capabilities or {})
    data["labels"] = dict(w.labels or {})
    data.setdefault("hostname", w.hostname)
    data.setdefault("tokentrace_version", "")
    try:
        return WorkerCapabilities.model_validate(data)
    except ValidationError:
        return None


def requirement_text(req: JobRequirements) -> str:
    parts = [f"{k}={v}" for k, v in sorted(req.labels.items())]
    if req.gpu_name:
        parts.append(f"a GPU named like {req.gpu_name!r}")
    if req.min_gpu_memory_mb is not None:
        parts.append(f"a GPU with at least {req.min_gpu_memory_mb} MB")
    return ", ".join(parts) if parts else "any worker"


def waiting_reason(job: Job, online: list[Worker]) -> str:
    """Why a queued job is still queued, as far as this server can tell."""
    try:
        req = JobRequirements.model_validate(job.requirements or {})
    except ValidationError:
        return "its requirements are not valid: no worker takes it"
    if not online:
        return "no worker is online"
    caps = [(w, _caps(w)) for w in online]
    fit = [(w, c) for w, c in caps if c is not None and matches(req, c)]
    if not fit:
        return f"no online worker matches its requirements ({requirement_text(req)})"
    if job.kind == "probe" and not any(c.torch_version for _w, c in fit):
        return (
            "no matching online worker has torch: probe jobs need a worker started with "
            "--kind probe where torch is installed"
        )
    if all(w.current_job_id for w, _c in fit):
        return "every matching worker is busy: it runs when one is free"
    return "waiting for a matching worker to lease it"


def worker_rows(
    workers: list[Worker], jobs: dict[str, Job], *, now: dt.datetime, ttl_s: float
) -> list[dict[str, Any]]:
    """``jobs``: the workers' current jobs by id."""
    out = []
    for w in workers:
        caps = w.capabilities or {}
        age = (now - w.last_seen_at).total_seconds()
        job = jobs.get(w.current_job_id or "")
        out.append(
            {
                "id": w.id,
                "name": w.name,
                "hostname": w.hostname,
                "gpus": caps.get("gpus") or [],
                "cpu": caps.get("cpu"),
                "cpu_count": caps.get("cpu_count"),
                "torch": caps.get("torch_version"),
                "version": caps.get("tokentrace_version"),
                "labels": dict(w.labels or {}),
                "registered_at": w.registered_at,
                "last_seen_at": w.last_seen_at,
                "age_s": max(0, int(age)),
                "age": age_text(age),
                "online": age <= ttl_s,
                "current_job_id": w.current_job_id,
                "job": job_link(job) if job is not None else None,
            }
        )
    return out


def queue_rows(
    queued: list[Job], workers: list[Worker], *, now: dt.datetime, ttl_s: float
) -> list[dict[str, Any]]:
    """Queued jobs, oldest first, each with its requirements and why it waits."""
    online = [w for w in workers if (now - w.last_seen_at).total_seconds() <= ttl_s]
    rows = []
    for job in sorted(queued, key=lambda j: (j.created_at, j.id)):
        try:
            req_text = requirement_text(JobRequirements.model_validate(job.requirements or {}))
        except ValidationError:
            req_text = "invalid"
        rows.append(
            {
                "job": job_link(job),
                "created_at": job.created_at,
                "waiting": age_text((now - job.created_at).total_seconds()),
                "attempt": job.attempt,
                "requirements": req_text,
                "reason": waiting_reason(job, online),
            }
        )
    return rows
