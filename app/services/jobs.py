"""The job lifecycle, whatever the kind: lease a queued job to a worker, follow its
heartbeats, take its results in numbered idempotent batches, complete it; cancel, delete,
and expire lost leases. What differs by kind (bench, sweep, probe) is asked of the kind's
rules (``app.services.job_kinds``).

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

from app.client.sessions import MAX_SESSION_TURNS
from app.domain import RequestRecord, RunStatus
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
    WorkerCapabilities,
)
from app.services import live_series, shard_jobs, sharded_sweeps
from app.services import workers as worker_svc
from app.services.auth import Principal
from app.services.errors import Conflict, Invalid, NotFound
from app.services.job_kinds import rules_of
from app.services.job_rules import (
    Outcome,
    finalize_outcome,
    index_bound,
    leased_job,
    planned_text,
    public_spec,
    reported_planned,
)
from app.services.runs import store_requests
from app.services.secretbox import SecretBox
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.jobs import ACTIVE_STATES, TERMINAL_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, Worker, utcnow

log = logging.getLogger(__name__)

LEASE_SCAN = 200  # queued jobs examined per lease call


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
            if not job_repo.claim_queued(session, job.id):  # another lease holds it
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
    resume = rules_of(chosen).lease_resume(session, chosen)  # a sweep's steps to replay
    return LeasedJob(
        job_id=chosen.id,
        kind=chosen.kind,  # type: ignore[arg-type]
        spec=box.open_spec(dict(chosen.spec)),
        run_id=chosen.run_id,
        attempt=chosen.attempt,
        lease_id=lease_id,
        lease_expires_at=expires,
        resume=resume,
        shard=chosen.shard_idx,
    )


def heartbeat(
    session: Session, job_id: str, req: HeartbeatRequest, principal: Principal, *, ttl_s: float
) -> HeartbeatResponse:
    """Renew the lease, store progress, mark the job running; say whether to cancel."""
    job = leased_job(session, job_id, req.lease_id, principal)
    now = utcnow()
    expires = now + dt.timedelta(seconds=ttl_s)
    values: dict[str, Any] = {"lease_expires_at": expires}
    if req.progress is not None:
        values["progress"] = json_safe(req.progress.model_dump(mode="json"))
        live_series.record(session, job_id, values["progress"])  # the run page's live series
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


def batch_records(job: Job, batch: ResultBatch) -> list[RequestRecord]:
    """A batch's records, checked: each index within its spec's bound (``index_bound``), once
    in the batch, its events decodable (an ``Invalid`` names the request)."""
    spec = rules_of(job).bench_spec(job)  # a sweep's: each step's
    bound = index_bound(spec)
    seen: set[int] = set()
    out: list[RequestRecord] = []
    for i, w in enumerate(batch.requests):
        loc = ("body", "requests", i, "index")
        if w.index >= bound:
            plan = (
                f"{spec.get('num_prompts')} sessions of up to "
                f"{spec.get('max_turns') or MAX_SESSION_TURNS} turns"
                if spec.get("multi_turn")
                else f"{spec.get('num_prompts')} requests"
                if spec.get("num_prompts") is not None
                else "a whole trace"
            )
            raise Invalid(
                f"requests[{i}].index {w.index} is outside 0..{bound - 1} "
                f"(the spec plans {plan}, and {spec.get('warmup_requests') or 0} warm-ups)",
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
    job = leased_job(session, job_id, batch.lease_id, principal)
    run_id = rules_of(job).batch_run(session, job, batch)  # first: a sweep refuses old numbers
    if job_repo.batch_exists(session, job_id, batch.batch_no):
        return BatchAck(batch_no=batch.batch_no, accepted=0, duplicate=True)
    if run_id is None:
        raise Conflict(f"job {job_id!r} has no run to store results in")
    records = batch_records(job, batch)
    for r in records:  # a run dealt over workers: the shard is the lease's, not the worker's word
        r.shard = job.shard_idx
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


def complete(
    session: Session,
    sessions: sessionmaker[Session],
    job_id: str,
    req: CompleteRequest,
    principal: Principal,
) -> CompleteResponse:
    """End a job: check every batch arrived, then let its kind end it (the job's terminal
    state is committed before its run is finalized). A retry of the same completion answers
    the same result."""
    job = job_repo.get_job(session, job_id)
    if job is not None and job.state in TERMINAL_STATES and job.lease_id == req.lease_id:
        worker_svc.check_job_owner(session, job, principal)
        rules_of(job).recomplete(session, sessions, job, req)
        return CompleteResponse(job_id=job.id, state=job.state, run_id=job.run_id)  # type: ignore[arg-type]
    job = leased_job(session, job_id, req.lease_id, principal)
    rules = rules_of(job)
    missing = rules.missing_batches(session, job, req.total_batches)
    if missing:
        raise Conflict(
            f"batches missing: {missing} (of total_batches={req.total_batches}); "
            "upload them, then complete again"
        )
    return rules.complete(session, sessions, job, req)


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
    shards = job_repo.shard_jobs(session, run_id)
    if shards and any(j.state not in TERMINAL_STATES for j in shards):  # every shard stops
        state = shard_jobs.cancel_shards(session, run_id, shards)
        return CancelResult(run_id, shards[0].id, state, state != "cancelled")
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
    shards = job_repo.shard_jobs(session, run_id)  # a dealt run: any shard still running
    job = next((j for j in shards if j.state in ACTIVE_STATES), job)
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
    rules = rules_of(job)
    n_batches = rules.kept_uploads(session, job)  # a sweep's: its steps created, too
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
        "shard_ready_at": None,  # a shard requeued before the start: ready again once leased
        "shard_warm_at": None,
    }
    if job.shard_idx is not None and job.shard_start_ns is not None:  # a shard lost after
        # the common start: it cannot restart alone; the run ends once the other shards do
        state: JobState = "cancelled" if job.cancel_requested else "failed"
        error = f"worker lost (lease expired on attempt {job.attempt})"
        return Expiry(job.id, job.run_id, "partial"), ended | {"state": state, "error": error}, None
    resumable = rules.resumes_after_loss(job)
    if resumable and not job.cancel_requested and job.attempt < job.max_attempts:
        error = f"attempt {job.attempt} lost (lease expired); requeued"
        if n_batches:
            error += " to resume: completed steps are kept"
        return Expiry(job.id, job.run_id, "requeued"), requeue | {"error": error}, None
    if n_batches:
        stored = job_repo.stored_requests(session, job.run_id) if job.run_id else 0
        planned = planned_text(rules.bench_spec(job), reported_planned(job.progress))
        note = (
            f"worker lost: {stored} of {planned} were stored "
            f"(lease expired on attempt {job.attempt})"
        )
        state = "cancelled" if job.cancel_requested else "failed"
        loss = rules.loss(session, job)
        outcome = Outcome(state, RunStatus.PARTIAL, "worker lost", [note, *loss.notes], loss.lost)
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


def expire_lost_leases(
    sessions: sessionmaker[Session], *, now: dt.datetime | None = None
) -> list[Expiry]:
    """Apply the lost-lease rule (app/protocol/wire.py) to every lease expired before ``now``."""
    cutoff = now or utcnow()
    done: list[Expiry] = []
    to_finalize: list[tuple[str, Outcome]] = []
    shard_runs: set[str] = set()
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
            to_finalize += rules_of(job).after_loss(s, job, expiry.outcome)
            if job.shard_idx is not None and job.run_id is not None:  # the run ends with its
                shard_runs.add(job.run_id)  # last shard (requeued: it waits to be leased)
            elif job.run_id is not None:
                if outcome is None:
                    repo.update_run(s, job.run_id, status=RunStatus.QUEUED)
                else:
                    to_finalize.append((job.run_id, outcome))
            done.append(expiry)
    for run_id, outcome in to_finalize:
        try:
            finalize_outcome(sessions, run_id, outcome, None)
        except Exception:
            log.exception("finalizing run %s after a lost lease failed", run_id)
    for run_id in shard_runs:
        try:
            if shard_jobs.finish_if_done(sessions, run_id):
                sharded_sweeps.after_run(sessions, run_id)  # a sweep's step: go on
        except Exception:
            log.exception("finalizing run %s after a lost shard failed", run_id)
    return done


def extend_leases(sessions: sessionmaker[Session], *, ttl_s: float) -> int:
    """At server start: give every active lease one more TTL (no heartbeat could arrive
    while the server was down). Returns how many leases moved."""
    with session_scope(sessions) as s:
        return job_repo.extend_active_leases(s, utcnow() + dt.timedelta(seconds=ttl_s))


def new_lease_lock(dialect: str) -> AbstractContextManager[Any] | None:
    """The in-process lock that serializes leasing on SQLite (PostgreSQL: row locks)."""
    return threading.Lock() if dialect == "sqlite" else None
