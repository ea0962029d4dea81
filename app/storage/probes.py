"""SQL for probes, their artifacts, job telemetry and run annotations. The caller owns
the transaction."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.storage.models import Job, Run, utcnow
from app.storage.models_probes import JobTelemetry, Probe, ProbeArtifact, RunAnnotation


def new_probe_id() -> str:
    return secrets.token_hex(8)


def create_probe(
    session: Session,
    *,
    kind: str,
    device: str,
    params: dict[str, Any],
    name: str | None = None,
    job_id: str | None = None,
    status: str = "queued",
    probe_id: str | None = None,
) -> Probe:
    row = Probe(
        id=probe_id or new_probe_id(),
        kind=kind,
        device=device,
        name=name,
        job_id=job_id,
        status=status,
        params=params,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_probe(session: Session, probe_id: str) -> Probe | None:
    return session.get(Probe, probe_id)


def probe_for_job(session: Session, job_id: str) -> Probe | None:
    return session.scalars(select(Probe).where(Probe.job_id == job_id)).first()


def list_probes(
    session: Session,
    *,
    kind: str | None = None,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Probe]:
    stmt = select(Probe)
    if kind is not None:
        stmt = stmt.where(Probe.kind == kind)
    if status is not None:
        stmt = stmt.where(Probe.status == status)
    stmt = stmt.order_by(Probe.created_at.desc(), Probe.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(stmt))


def count_probes(session: Session, *, kind: str | None = None) -> int:
    stmt = select(func.count()).select_from(Probe)
    if kind is not None:
        stmt = stmt.where(Probe.kind == kind)
    return int(session.scalar(stmt) or 0)


def jobs_by_id(session: Session, ids: list[str]) -> dict[str, Job]:
    if not ids:
        return {}
    return {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids)))}


def finish_probe(
    session: Session,
    probe: Probe,
    *,
    status: str,
    fingerprint: dict[str, Any] | None,
    result: dict[str, Any] | None,
    telemetry: list[dict[str, Any]] | None,
    error: str | None,
) -> None:
    probe.status = status
    probe.fingerprint = fingerprint
    probe.result = result
    probe.telemetry = telemetry
    probe.error = error
    probe.finished_at = utcnow()
    session.flush()


def set_probe_status(session: Session, probe: Probe, status: str) -> None:
    probe.status = status
    session.flush()


def delete_probe(session: Session, probe: Probe) -> None:
    session.execute(delete(ProbeArtifact).where(ProbeArtifact.probe_id == probe.id))
    session.delete(probe)
    session.flush()


# ---------------------------------------------------------------------------- artifacts


def add_artifact(
    session: Session, probe_id: str, name: str, content_type: str, data: bytes
) -> ProbeArtifact:
    row = ProbeArtifact(
        probe_id=probe_id,
        name=name,
        content_type=content_type,
        size=len(data),
        data=data,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def artifact_index(session: Session, probe_id: str) -> list[dict[str, Any]]:
    """Name, type and size of each artifact (not the data)."""
    stmt = (
        select(ProbeArtifact.name, ProbeArtifact.content_type, ProbeArtifact.size)
        .where(ProbeArtifact.probe_id == probe_id)
        .order_by(ProbeArtifact.name)
    )
    return [{"name": n, "content_type": c, "size": s} for n, c, s in session.execute(stmt)]


def get_artifact(session: Session, probe_id: str, name: str) -> ProbeArtifact | None:
    stmt = select(ProbeArtifact).where(
        ProbeArtifact.probe_id == probe_id, ProbeArtifact.name == name
    )
    return session.scalars(stmt).first()


# ---------------------------------------------------------------------------- telemetry


def add_telemetry(session: Session, job_id: str, seq: int, samples: list[dict[str, Any]]) -> bool:
    """Store one upload; False when (job, seq) was already stored (a retry)."""
    exists = session.scalar(
        select(func.count())
        .select_from(JobTelemetry)
        .where(JobTelemetry.job_id == job_id, JobTelemetry.seq == seq)
    )
    if exists:
        return False
    session.add(JobTelemetry(job_id=job_id, seq=seq, samples=samples, created_at=utcnow()))
    session.flush()
    return True


def job_telemetry(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Every sample of a job, in upload order."""
    stmt = select(JobTelemetry.samples).where(JobTelemetry.job_id == job_id)
    out: list[dict[str, Any]] = []
    for (samples,) in session.execute(stmt.order_by(JobTelemetry.seq)):
        out.extend(samples)
    return out


def has_telemetry(session: Session, job_id: str) -> bool:
    """Whether any telemetry upload of the job is stored."""
    stmt = select(JobTelemetry.id).where(JobTelemetry.job_id == job_id).limit(1)
    return session.scalar(stmt) is not None


# ---------------------------------------------------------------------------- annotations


def run_exists(session: Session, run_id: str) -> bool:
    return session.get(Run, run_id) is not None


def set_annotation(
    session: Session,
    run_id: str,
    *,
    model: dict[str, Any],
    device: str | None,
    dtypes: dict[str, Any],
) -> RunAnnotation:
    row = session.get(RunAnnotation, run_id)
    if row is None:
        row = RunAnnotation(run_id=run_id, model=model, device=device, dtypes=dtypes)
        session.add(row)
    else:
        row.model, row.device, row.dtypes = model, device, dtypes
    row.updated_at = utcnow()
    session.flush()
    return row


def get_annotation(session: Session, run_id: str) -> RunAnnotation | None:
    return session.get(RunAnnotation, run_id)


def annotated_runs(session: Session, limit: int = 200) -> list[tuple[Run, RunAnnotation]]:
    stmt = (
        select(Run, RunAnnotation)
        .join(RunAnnotation, RunAnnotation.run_id == Run.id)
        .order_by(Run.created_at.desc())
        .limit(limit)
    )
    return [(r, a) for r, a in session.execute(stmt).all()]


def runs_by_id(session: Session, ids: list[str]) -> list[Run]:
    if not ids:
        return []
    return list(session.scalars(select(Run).where(Run.id.in_(ids))))
