"""Job kind ``probe``: queue a probe job, and take its result and device telemetry from the
worker holding its lease. Its life after the lease is a single-run kind's with no run
(``app.services.bench_jobs.SingleRunKind``); the probe's status follows its job's.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sqlalchemy.orm import Session

from app.probes.spec import ProbeSpec
from app.protocol.probe_wire import ProbeResultAck, ProbeResultUpload, TelemetryAck, TelemetryUpload
from app.protocol.wire import JobRequirements
from app.services import workers as worker_svc
from app.services.auth import Principal
from app.services.bench_jobs import SingleRunKind
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage.jobs import ACTIVE_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import Job
from app.storage.models_probes import Probe

PROBE = SingleRunKind("probe")


def submit(
    session: Session, spec: ProbeSpec, *, requirements: JobRequirements, max_attempts: int
) -> tuple[str, str]:
    """A queued probe and its job: (probe_id, job_id)."""
    probe_id = probe_repo.new_probe_id()
    job = job_repo.create_job(
        session,
        kind="probe",
        spec={"probe_id": probe_id, "probe": spec.model_dump(mode="json")},
        requirements=requirements.model_dump(mode="json"),
        run_id=None,
        max_attempts=max_attempts,
    )
    probe_repo.create_probe(
        session,
        probe_id=probe_id,
        kind=spec.kind,
        device=spec.device,
        params=spec.params,
        name=spec.name,
        job_id=job.id,
    )
    return probe_id, job.id


def finish_probe(
    session: Session,
    row: Probe,
    *,
    status: str,
    fingerprint: dict[str, Any] | None,
    result: dict[str, Any] | None,
    telemetry: list[dict[str, Any]],
    error: str | None,
    artifacts: list[tuple[str, str, bytes]],
    max_artifact_bytes: int,
) -> None:
    for i, (name, _ctype, data) in enumerate(artifacts):
        if len(data) > max_artifact_bytes:
            raise Invalid(
                f"artifacts[{i}] {name!r} is {len(data):,} bytes; the limit is "
                f"{max_artifact_bytes:,} (TOKENTRACE_PROBE_ARTIFACT_MAX_MB)",
                loc=("body", "artifacts", i, "data_b64"),
            )
    names = [a[0] for a in artifacts]
    if len(set(names)) != len(names):
        raise Invalid("artifact names must be unique", loc=("body", "artifacts"))
    probe_repo.finish_probe(
        session,
        row,
        status=status,
        fingerprint=json_safe(fingerprint) if fingerprint is not None else None,
        result=json_safe(result) if result is not None else None,
        telemetry=json_safe(telemetry) if telemetry else None,
        error=error,
    )
    for name, ctype, data in artifacts:
        probe_repo.add_artifact(session, row.id, name, ctype, data)


# ---------------------------------------------------------------------- worker uploads


def _job_of_lease(session: Session, job_id: str, lease_id: str, principal: Principal) -> Job:
    job = job_repo.get_job(session, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}")
    if job.lease_id != lease_id:
        raise Conflict(f"lease lost: job {job_id!r} is leased under another lease_id now")
    worker_svc.check_job_owner(session, job, principal)
    return job


def store_result(
    session: Session,
    job_id: str,
    body: ProbeResultUpload,
    principal: Principal,
    *,
    max_artifact_bytes: int,
) -> ProbeResultAck:
    """Store a probe job's result (once: a retry after success is a duplicate)."""
    job = _job_of_lease(session, job_id, body.lease_id, principal)
    if job.kind != "probe":
        raise Conflict(f"job {job_id!r} is a {job.kind} job, not a probe")
    row = probe_repo.probe_for_job(session, job_id)
    if row is None:
        raise Conflict(f"job {job_id!r} has no probe to store a result in (deleted?)")
    if row.status in ("succeeded", "failed"):
        n = len(probe_repo.artifact_index(session, row.id))
        return ProbeResultAck(probe_id=row.id, status=row.status, duplicate=True, artifacts=n)
    if job.state not in ACTIVE_STATES:
        raise Conflict(f"lease lost: job {job_id!r} is {job.state}")
    if body.status == "succeeded" and body.result is None:
        raise Invalid("a succeeded probe needs a result", loc=("body", "result"))
    if body.status == "failed" and not body.error:
        raise Invalid("a failed probe needs an error", loc=("body", "error"))
    decoded: list[tuple[str, str, bytes]] = []
    for i, a in enumerate(body.artifacts):
        try:
            data = base64.b64decode(a.data_b64.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise Invalid(
                f"artifacts[{i}].data_b64 is not base64", loc=("body", "artifacts", i, "data_b64")
            ) from None
        decoded.append((a.name, a.content_type, data))
    finish_probe(
        session,
        row,
        status=body.status,
        fingerprint=body.fingerprint,
        result=body.result,
        telemetry=body.telemetry,
        error=body.error,
        artifacts=decoded,
        max_artifact_bytes=max_artifact_bytes,
    )
    return ProbeResultAck(
        probe_id=row.id, status=body.status, duplicate=False, artifacts=len(decoded)
    )


def store_telemetry(
    session: Session, job_id: str, body: TelemetryUpload, principal: Principal
) -> TelemetryAck:
    """Device samples of any job, from the worker holding (or that last held) its lease."""
    _job_of_lease(session, job_id, body.lease_id, principal)
    samples = [s.model_dump(mode="json") for s in body.samples]
    added = probe_repo.add_telemetry(session, job_id, body.seq, json_safe(samples))
    return TelemetryAck(accepted=len(samples) if added else 0, duplicate=not added)
