"""Jobs: queue a bench run, lease it to a worker, follow its heartbeats, take its results
in numbered idempotent batches, complete it; cancel, delete, and expire lost leases.

Functions take the request's ``Session`` and never commit it, except where noted: leasing
commits inside its lock, and completion commits before ``finalize_run`` (which uses
sessions of its own) computes the report.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.trust import RequestTally, run_status, spec_error_bound
from app.domain import RequestRecord, RunSpec, RunStatus
from app.protocol.wire import (
    BatchAck,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JobKind,
    JobRequirements,
    JobState,
    LeasedJob,
    ResultBatch,
    RunMeta,
    WorkerCapabilities,
)
from app.services import workers as worker_svc
from app.services.auth import Principal
from app.services.errors import Conflict, Invalid, NotFound
from app.services.runs import finalize_run, store_requests
from app.services.secretbox import SEALED, SecretBox
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.jobs import ACTIVE_STATES, TERMINAL_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, Worker, utcnow

log = logging.getLogger(__name__)

LEASE_SCAN = 200  # queued jobs examined per lease call
ACTIVE_RUN = (RunStatus.QUEUED, RunStatus.RUNNING)


def bench_job_spec(spec: RunSpec, box: SecretBox) -> dict[str, Any]:
    """What a worker needs: the spec as JSON plus the API key (excluded from dumps), sealed."""
    out: dict[str, Any] = json_safe(spec.model_dump(mode="json"))
    if spec.api_key:
        out["api_key"] = spec.api_key
    return box.seal_spec(out)


def public_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A job spec without secrets, for listings."""
    return {k: v for k, v in spec.items() if k not in ("api_key", SEALED)}


def planned_requests(job: Job) -> int:
    spec = job.spec or {}
    if job.kind == "sweep":  # every step plans the base spec's requests
        spec = spec.get("bench") or {}
    return int(spec.get("num_prompts") or 0) + int(spec.get("warmup_requests") or 0)


def create_bench_run(
    session: Session,
    spec: RunSpec,
    *,
    requirements: JobRequirements,
    name: str | None,
    max_attempts: int,
    box: SecretBox,
) -> tuple[str, str]:
    """A queued run and its bench job, in the caller's transaction: (run_id, job_id)."""
    run_id = repo.create_run(session, spec, source="bench", name=name, status=RunStatus.QUEUED)
    job = job_repo.create_job(
        session,
        kind="bench",
        spec=bench_job_spec(spec, box),
        requirements=requirements.model_dump(mode="json"),
        run_id=run_id,
        max_attempts=max_attempts,
    )
    return run_id, job.id


# ---------------------------------------------------------------------------------- lease


def lease(
    session: Session,
    worker: Worker,
    kinds: list[JobKind],
    *,
    ttl_s: float,
    box: SecretBox,
    lock: AbstractContextManager[Any] | None = None,
) -> LeasedJob | None:
    """Hand the oldest matching queued job to ``worker``, or None. Commits the session
    (inside ``lock``: on SQLite pass a ``threading.Lock``; PostgreSQL uses row locks).
    The job's sealed API key is opened for this answer only (``box``)."""
    caps = WorkerCapabilities.model_validate(worker.capabilities)
    now = utcnow()
    with lock if lock is not None else nullcontext():
        chosen: Job | None = None
        lease_id = secrets.token_hex(16)
        expires = now + dt.timedelta(seconds=ttl_s)
        for job in job_repo.queued_candidates(session, kinds, LEASE_SCAN):
            if not worker_svc.matches(JobRequirements.model_validate(job.requirements), caps):
                continue
            won = job_repo.transition(
                session,
                job.id,
                from_states=("queued",),
                state="leased",
                lease_id=lease_id,
                worker_id=worker.id,
                lease_expires_at=expires,
                attempt=Job.attempt + 1,
                progress=None,
            )
            if won:
                chosen = job
                break
        worker_repo.seen(session, worker.id, now, current_job_id=chosen.id if chosen else None)
        session.commit()
    if chosen is None:
        return None
    resume = None
    if chosen.kind == "sweep":  # attempt >= 2: the steps to replay (app.services.sweep_jobs)
        from app.services import sweep_jobs

        resume = sweep_jobs.resume_of(session, chosen)
    return LeasedJob(
        job_id=chosen.id,
        kind=chosen.kind,  # type: ignore[arg-type]
        spec=box.open_spec(dict(chosen.spec)),
        run_id=chosen.run_id,
        attempt=chosen.attempt,
        lease_id=lease_id,
        lease_expires_at=expires,
        resume=resume,
    )


def _leased_job(session: Session, job_id: str, lease_id: str, principal: Principal) -> Job:
    """The job, if ``lease_id`` is its live lease and the caller may act on it (else 409)."""
    job = job_repo.get_job(session, job_id)
    if job is None:
        raise Conflict(f"lease lost: job {job_id!r} no longer exists")
    if job.lease_id != lease_id:
        raise Conflict(f"lease lost: job {job_id!r} is leased under another lease_id now")
    if job.state not in ACTIVE_STATES:
        raise Conflict(f"lease lost: job {job_id!r} is {job.state}")
    worker_svc.check_job_owner(session, job, principal)
    if job.lease_expires_at is not None and job.lease_expires_at < utcnow():
        raise Conflict(f"lease lost: the lease on job {job_id!r} expired")
    return job


def heartbeat(
    session: Session, job_id: str, req: HeartbeatRequest, principal: Principal, *, ttl_s: float
) -> HeartbeatResponse:
    """Renew the lease, store progress, mark the job running; say whether to cancel."""
    job = _leased_job(session, job_id, req.lease_id, principal)
    now = utcnow()
    expires = now + dt.timedelta(seconds=ttl_s)
    values: dict[str, Any] = {"lease_expires_at": expires}
    if req.progress is not None:
        values["progress"] = json_safe(req.progress.model_dump(mode="json"))
    starting = job.state == "leased"
    if starting:
        values.update(state="running", started_at=job.started_at or now)
    if not job_repo.transition(
        session, job_id, from_states=ACTIVE_STATES, holding_lease=req.lease_id, **values
    ):
        raise Conflict(f"lease lost: job {job_id!r} changed while renewing its lease")
    if starting and job.run_id is not None:
        run = repo.find_run(session, job.run_id)
        if run is not None and run.status is RunStatus.QUEUED:
            repo.start_run(session, job.run_id, started_at=now)
    if job.worker_id:
        worker_repo.seen(session, job.worker_id, now, current_job_id=job_id)
    return HeartbeatResponse(cancel=job.cancel_requested, lease_expires_at=expires)


# -------------------------------------------------------------------------------- results


def _records(job: Job, batch: ResultBatch) -> list[RequestRecord]:
    planned = planned_requests(job)  # a sweep's steps all plan the base spec's requests
    seen: set[int] = set()
    out: list[RequestRecord] = []
    for i, w in enumerate(batch.requests):
        loc = ("body", "requests", i, "index")
        if w.index >= planned:
            raise Invalid(
                f"requests[{i}].index {w.index} is outside 0..{planned - 1} "
                f"(the spec plans {planned} requests, warm-ups included)",
                loc=loc,
            )
        if w.index in seen:
            raise Invalid(f"requests[{i}].index {w.index} appears twice in this batch", loc=loc)
        seen.add(w.index)
        try:
            out.append(w.to_record())
        except (ValueError, TypeError) as e:
            raise Invalid(
                f"requests[{i}].events_b64: {e}", loc=("body", "requests", i, "events_b64")
            ) from None
    return out


def ingest_batch(
    session: Session, job_id: str, batch: ResultBatch, principal: Principal
) -> BatchAck:
    """Store one numbered batch; a batch_no already stored is a duplicate and changes nothing.
    The batch row and its requests are written in the caller's one transaction."""
    job = _leased_job(session, job_id, batch.lease_id, principal)
    run_id = job.run_id
    if job.kind == "sweep":  # checked first: a batch_no of an earlier attempt is refused
        from app.services import sweep_jobs

        run_id = sweep_jobs.batch_run(session, job, batch)
    if job_repo.batch_exists(session, job_id, batch.batch_no):
        return BatchAck(batch_no=batch.batch_no, accepted=0, duplicate=True)
    if run_id is None:
        raise Conflict(f"job {job_id!r} has no run to store results in")
    records = _records(job, batch)
    indices = [r.index for r in records]
    if not job_repo.add_batch(session, job_id, batch.batch_no, job.attempt, len(records), indices):
        return BatchAck(batch_no=batch.batch_no, accepted=0, duplicate=True)
    before = job_repo.stored_requests(session, run_id)
    try:
        store_requests(session, run_id, records)
    except (ValueError, TypeError) as e:
        raise Invalid(f"requests: {e}", loc=("body", "requests")) from None
    accepted = job_repo.stored_requests(session, run_id) - before
    return BatchAck(batch_no=batch.batch_no, accepted=accepted, duplicate=False)


# ------------------------------------------------------------------------------- complete


@dataclass(frozen=True)
class Outcome:
    job_state: JobState
    run_status: RunStatus
    error: str | None
    notes: list[str]


def _decide(session: Session, job: Job, req: CompleteRequest) -> Outcome:
    outcome = decide(session, job, job.run_id, req.status, req.error, req.run_meta)
    if job.run_id is None or job.kind != "bench":  # a sweep's batches span its step runs
        return outcome
    return with_arrival_check(outcome, arrival_notes(session, job, job.run_id, req.total_batches))


MAX_NAMED = 20  # indices or batch numbers named in a note; the rest are counted
MAX_MISSING_NAMED = 1000  # batch numbers a "batches missing" 409 names (the worker resends)


def _named(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:MAX_NAMED])
    more = len(numbers) - MAX_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def arrival_notes(session: Session, job: Job, run_id: str, total_batches: int | None) -> list[str]:
    """What did not arrive: batches 0..n-1 (``total_batches`` as the worker said; else up
    to the highest batch number stored) and every request index a stored batch declared.
    Empty when everything arrived (exactly once: requests are unique per run and index).
    E.g. "2 of 40 requests missing: indices 7, 9; batch 3 never arrived"."""
    declared = job_repo.batch_indices(session, job.id)
    if total_batches is None:
        total_batches = max(declared) + 1 if declared else 0
    parts: list[str] = []
    expected = {i for idx in declared.values() if idx is not None for i in idx}
    missing: list[int] = []
    # stored requests all came in batches: as many stored as declared means none is missing
    unknown = any(idx is None for idx in declared.values())  # batches stored before 0009
    if unknown or job_repo.stored_requests(session, run_id) < len(expected):
        missing = sorted(expected - job_repo.stored_indices(session, run_id))
    if missing:
        parts.append(
            f"{len(missing)} of {len(expected)} requests missing: indices {_named(missing)}"
        )
    n_lost = job_repo.count_missing(0, total_batches, declared)
    if n_lost:
        lost = job_repo.missing_numbers(0, total_batches, declared, MAX_NAMED)
        word = "batch" if n_lost == 1 else "batches"
        more = f" and {n_lost - len(lost)} more" if n_lost > len(lost) else ""
        parts.append(f"{word} {_named(lost)}{more} never arrived")
    return ["; ".join(parts)] if parts else []


def with_arrival_check(outcome: Outcome, notes: list[str]) -> Outcome:
    """A run that lost uploaded data is ``partial`` (a failed one stays failed)."""
    if not notes:
        return outcome
    status = RunStatus.PARTIAL if outcome.run_status is RunStatus.SUCCEEDED else outcome.run_status
    return Outcome(outcome.job_state, status, outcome.error, outcome.notes + notes)


def decide(
    session: Session,
    job: Job,
    run_id: str | None,
    status_: Literal["succeeded", "failed", "cancelled"],
    error_: str | None,
    meta: RunMeta | None,
) -> Outcome:
    """The job's end state and ``run_id``'s status from what the worker reported."""
    stored = job_repo.stored_requests(session, run_id) if run_id else 0
    planned = planned_requests(job)
    if job.cancel_requested or status_ == "cancelled":
        status = RunStatus.PARTIAL if stored else RunStatus.CANCELLED
        note = f"cancelled: {stored} of {planned} planned requests were stored"
        return Outcome("cancelled", status, None, [note])
    sent, ok = job_repo.sent_counts(session, run_id) if run_id else (0, 0)
    stopped = (meta.load_stats.get("stopped") if meta else None) == "stopped"
    run = repo.find_run(session, run_id) if run_id else None
    bound = spec_error_bound(run.spec if run is not None else None)
    status = run_status(RequestTally(sent, ok), stopped=stopped, max_error_rate=bound)
    if status_ == "failed":
        error = error_ or "the worker reported a failure"
        if meta is None:  # the load itself broke: what was stored is a part of the run
            status = RunStatus.PARTIAL if stored else RunStatus.FAILED
        note = f"failed on the worker: {error} ({stored} of {planned} requests stored)"
        return Outcome("failed", status, error, [note])
    return Outcome("succeeded", status, None, [])


def _finalize(
    sessions: sessionmaker[Session],
    run_id: str,
    outcome: Outcome,
    req: CompleteRequest | None,
) -> None:
    finalize_run(
        sessions,
        run_id,
        status=outcome.run_status,
        meta=req.run_meta if req is not None else None,
        extra_notes=outcome.notes or None,
    )


def complete(
    session: Session,
    sessions: sessionmaker[Session],
    job_id: str,
    req: CompleteRequest,
    principal: Principal,
) -> CompleteResponse:
    """End a job: check every batch arrived, move the job to its terminal state (commits),
    then finalize the run with the worker's ``RunMeta``. A retry of the same completion
    answers the same result."""
    job = job_repo.get_job(session, job_id)
    if job is not None and job.state in TERMINAL_STATES and job.lease_id == req.lease_id:
        worker_svc.check_job_owner(session, job, principal)
        run = repo.find_run(session, job.run_id) if job.run_id else None
        if run is not None and run.status in ACTIVE_RUN:  # the first try failed mid-way
            outcome = _decide(session, job, req)
            session.commit()
            _finalize(sessions, run.id, outcome, req)
        return CompleteResponse(job_id=job.id, state=job.state, run_id=job.run_id)  # type: ignore[arg-type]
    job = _leased_job(session, job_id, req.lease_id, principal)
    if job.kind == "sweep":  # a resumed attempt numbers its batches after earlier ones
        from app.services import sweep_jobs

        missing = sweep_jobs.missing_batches(session, job, req.total_batches)
    else:
        present = job_repo.batch_numbers(session, job_id)
        missing = job_repo.missing_numbers(0, req.total_batches, present, MAX_MISSING_NAMED)
    if missing:
        raise Conflict(
            f"batches missing: {missing} (of total_batches={req.total_batches}); "
            "upload them, then complete again"
        )
    if job.kind == "sweep":
        return sweep_jobs.complete_sweep(session, sessions, job, req)
    outcome = _decide(session, job, req)
    now = utcnow()
    changed = job_repo.transition(
        session,
        job_id,
        from_states=ACTIVE_STATES,
        holding_lease=req.lease_id,
        state=outcome.job_state,
        error=outcome.error,
        finished_at=now,
        lease_expires_at=None,
        spec=public_spec(job.spec),
    )
    if not changed:
        raise Conflict(f"lease lost: job {job_id!r} changed while completing")
    if job.worker_id:
        worker_repo.seen(session, job.worker_id, now, current_job_id=None)
    if job.run_id is not None and req.run_meta is not None:
        from app.services.hardware import stamp_meta

        stamp_meta(session, job.worker_id, req.run_meta)  # which worker (and GPUs) ran it
        meta = req.run_meta
        changes = {"client_host": meta.client_host, "client_version": meta.client_version}
        repo.update_run(session, job.run_id, **{k: v for k, v in changes.items() if v})
    if job.run_id is not None and req.server_metrics:
        from app.services.server_metrics import store_wire

        store_wire(session, job.run_id, req.server_metrics)
    session.commit()
    if job.run_id is not None:
        _finalize(sessions, job.run_id, outcome, req)
    return CompleteResponse(job_id=job_id, state=outcome.job_state, run_id=job.run_id)


# -------------------------------------------------------------------------- cancel/delete


@dataclass(frozen=True)
class CancelResult:
    run_id: str
    job_id: str
    state: str
    cancel_requested: bool


def cancel_run(session: Session, run_id: str) -> CancelResult:
    """Queued: cancelled now. Leased/running: flagged; the worker sees it at its next
    heartbeat. Finished: 409."""
    run = repo.find_run(session, run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id!r}")
    job = job_repo.job_for_run(session, run_id)
    if job is None:
        raise Conflict(f"run {run_id!r} has no job (status {run.status.value}): nothing to cancel")
    now = utcnow()
    if job.state == "queued" and job_repo.transition(
        session,
        job.id,
        from_states=("queued",),
        state="cancelled",
        finished_at=now,
        spec=public_spec(job.spec),
    ):
        repo.finish_run(
            session,
            run_id,
            status=RunStatus.CANCELLED,
            finished_at=now,
            validity=[*(run.validity or []), "cancelled before it started"],
        )
        return CancelResult(run_id, job.id, "cancelled", False)
    if job.state in ACTIVE_STATES and job_repo.transition(
        session, job.id, from_states=ACTIVE_STATES, cancel_requested=True
    ):
        return CancelResult(run_id, job.id, job.state, True)
    raise Conflict(f"run {run_id!r} cannot be cancelled: its job is {job.state}")


def delete_run(session: Session, run_id: str, *, force: bool = False) -> None:
    """Delete a run with its requests and jobs; 409 while its job is leased or running
    (``force``: delete anyway; the worker's next heartbeat gets 409 and stops)."""
    if repo.find_run(session, run_id) is None:
        raise NotFound(f"no run with id {run_id!r}")
    job = job_repo.job_for_run(session, run_id)
    if job is not None and job.state in ACTIVE_STATES and not force:
        raise Conflict(
            f"run {run_id!r} is {job.state} on a worker: cancel it first, or delete with force=true"
        )
    job_repo.delete_jobs_of_run(session, run_id)
    repo.delete_run(session, run_id)


# ---------------------------------------------------------------------------- expiry


@dataclass(frozen=True)
class Expiry:
    job_id: str
    run_id: str | None
    outcome: Literal["requeued", "failed", "partial", "cancelled"]


def _expiry(session: Session, job: Job) -> tuple[Expiry, dict[str, Any], Outcome | None]:
    """What a lost lease means for ``job``: the expiry, the job's new values, and the run's
    outcome when the job ends here. A sweep job is requeued while attempts remain, whatever
    it uploaded: the next attempt resumes it (``app.services.sweep_jobs.resume_of``)."""
    n_batches = job_repo.count_batches(session, job.id)
    if job.kind == "sweep" and not n_batches:
        from app.services import sweep_jobs

        n_batches = sweep_jobs.step_count(session, job)  # steps created: keep them
    now = utcnow()
    ended: dict[str, Any] = {
        "finished_at": now,
        "lease_expires_at": None,
        "spec": public_spec(job.spec),
    }
    requeue = {
        "state": "queued",
        "lease_id": None,
        "worker_id": None,
        "lease_expires_at": None,
        "progress": None,
    }
    if job.kind == "sweep" and not job.cancel_requested and job.attempt < job.max_attempts:
        error = f"attempt {job.attempt} lost (lease expired); requeued"
        if n_batches:
            error += " to resume: completed steps are kept"
        return Expiry(job.id, job.run_id, "requeued"), requeue | {"error": error}, None
    if n_batches:
        stored = job_repo.stored_requests(session, job.run_id) if job.run_id else 0
        note = (
            f"worker lost: {stored} of {planned_requests(job)} planned requests were stored "
            f"(lease expired on attempt {job.attempt})"
        )
        state: JobState = "cancelled" if job.cancel_requested else "failed"
        notes = [note]
        if job.kind == "bench" and job.run_id is not None:
            notes += arrival_notes(session, job, job.run_id, None)
        outcome = Outcome(state, RunStatus.PARTIAL, "worker lost", notes)
        return (
            Expiry(job.id, job.run_id, "partial"),
            ended | {"state": state, "error": "worker lost"},
            outcome,
        )
    if job.cancel_requested:
        outcome = Outcome("cancelled", RunStatus.CANCELLED, None, ["cancelled; worker lost"])
        return Expiry(job.id, job.run_id, "cancelled"), ended | {"state": "cancelled"}, outcome
    if job.attempt < job.max_attempts:
        values = requeue | {"error": f"attempt {job.attempt} lost (lease expired); requeued"}
        return Expiry(job.id, job.run_id, "requeued"), values, None
    error = f"lease expired on all {job.max_attempts} attempts"
    outcome = Outcome("failed", RunStatus.FAILED, error, [f"failed: {error}"])
    return (
        Expiry(job.id, job.run_id, "failed"),
        ended | {"state": "failed", "error": error},
        outcome,
    )


def sweep_expired(
    sessions: sessionmaker[Session], *, now: dt.datetime | None = None
) -> list[Expiry]:
    """Apply the lost-lease rule (app/protocol/wire.py) to every lease expired before ``now``."""
    cutoff = now or utcnow()
    done: list[Expiry] = []
    to_finalize: list[tuple[str, Outcome]] = []
    with session_scope(sessions) as s:
        for job in job_repo.expired_leases(s, cutoff):
            expiry, values, outcome = _expiry(s, job)
            if not job_repo.transition(
                s,
                job.id,
                from_states=ACTIVE_STATES,
                holding_lease=job.lease_id,
                expired_before=cutoff,
                **values,
            ):
                continue  # renewed or finished meanwhile
            if job.worker_id:
                worker_repo.seen_job_done(s, job.worker_id, job.id)
            if job.kind == "sweep":
                from app.services import sweep_jobs

                to_finalize += sweep_jobs.expired(s, job, expiry.outcome)
            if job.run_id is not None:
                if outcome is None:
                    repo.update_run(s, job.run_id, status=RunStatus.QUEUED)
                else:
                    to_finalize.append((job.run_id, outcome))
            done.append(expiry)
    for run_id, outcome in to_finalize:
        try:
            _finalize(sessions, run_id, outcome, None)
        except Exception:
            log.exception("finalizing run %s after a lost lease failed", run_id)
    return done


def extend_leases(sessions: sessionmaker[Session], *, ttl_s: float) -> int:
    """At server start: give every active lease one more TTL (no heartbeat could arrive
    while the server was down). Returns how many leases moved."""
    with session_scope(sessions) as s:
        return job_repo.extend_active_leases(s, utcnow() + dt.timedelta(seconds=ttl_s))


def new_lease_lock(dialect: str) -> AbstractContextManager[Any] | None:
    """The in-process lock that serializes leasing on SQLite (PostgreSQL: row locks)."""
    return threading.Lock() if dialect == "sqlite" else None
