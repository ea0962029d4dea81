"""SQL for jobs and their uploaded result batches. The caller owns the transaction.

State changes are conditional ``UPDATE ... WHERE state IN (...) [AND lease_id = ...]``
statements whose row count says whether this caller won, so two servers (or threads) can
never both move the same job. On PostgreSQL a lease also locks the one row it takes with
``FOR UPDATE SKIP LOCKED`` (``claim_queued``), so concurrent lease calls skip each other's
row and no more.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Collection, Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, Select, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.protocol.wire import ACTIVE_JOB_STATES, TERMINAL_JOB_STATES
from app.storage.models import Job, JobBatch, Request, utcnow

ACTIVE_STATES = ACTIVE_JOB_STATES
TERMINAL_STATES = TERMINAL_JOB_STATES


def new_id() -> str:
    return secrets.token_hex(8)


def _locking(session: Session, stmt: Select[Any]) -> Select[Any]:
    """``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite has no row locks (one writer)."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def create_job(
    session: Session,
    *,
    kind: str,
    spec: dict[str, Any],
    requirements: dict[str, Any],
    run_id: str | None,
    max_attempts: int,
) -> Job:
    now = utcnow()
    job = Job(
        id=new_id(),
        kind=kind,
        state="queued",
        spec=spec,
        requirements=requirements,
        run_id=run_id,
        attempt=0,
        max_attempts=max_attempts,
        cancel_requested=False,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def refresh(session: Session, job: Job) -> Job:
    session.refresh(job)
    return job


def job_for_run(session: Session, run_id: str) -> Job | None:
    """The newest job of a run (a bench run has exactly one)."""
    stmt = select(Job).where(Job.run_id == run_id).order_by(Job.created_at.desc()).limit(1)
    return session.scalars(stmt).first()


def _job_filters(stmt: Select[Any], state: str | None, kind: str | None) -> Select[Any]:
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if kind is not None:
        stmt = stmt.where(Job.kind == kind)
    return stmt


def list_jobs(
    session: Session, *, state: str | None, kind: str | None, limit: int, offset: int
) -> list[Job]:
    stmt = _job_filters(select(Job), state, kind)
    stmt = stmt.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(stmt))


def count_jobs(session: Session, *, state: str | None, kind: str | None) -> int:
    stmt = _job_filters(select(func.count()).select_from(Job), state, kind)
    return int(session.scalar(stmt) or 0)


def queued_candidates(session: Session, kinds: Collection[str], limit: int) -> list[Job]:
    """Oldest queued jobs of these kinds, not locked: a lease locks only the one it takes
    (``claim_queued``), so a concurrent lease still sees every other queued job (locking
    them all hid them from another worker, which then got nothing even where the jobs
    matched only it)."""
    stmt = (
        select(Job)
        .where(Job.state == "queued", Job.kind.in_(list(kinds)))
        .order_by(Job.created_at, Job.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def claim_queued(session: Session, job_id: str) -> bool:
    """Lock a still-queued job's row for this transaction (PostgreSQL: ``FOR UPDATE SKIP
    LOCKED``, so a row another lease holds is passed over, not waited for); False when it is
    held or no longer queued. The lease's conditional update then takes it."""
    stmt = select(Job.id).where(Job.id == job_id, Job.state == "queued")
    return session.scalar(_locking(session, stmt)) is not None


def _rowcount(result: Any) -> int:
    return int(cast(CursorResult[Any], result).rowcount or 0)


def transition(
    session: Session,
    job_id: str,
    *,
    from_states: Sequence[str],
    holding_lease: str | None = None,
    expired_before: dt.datetime | None = None,
    **values: Any,
) -> bool:
    """Set ``values`` on the job if it is in one of ``from_states`` (and, when given, holds
    the lease ``holding_lease`` and its lease expired before ``expired_before``). Returns
    whether the row changed; the session's copy is refreshed."""
    stmt = update(Job).where(Job.id == job_id, Job.state.in_(list(from_states)))
    if holding_lease is not None:
        stmt = stmt.where(Job.lease_id == holding_lease)
    if expired_before is not None:
        stmt = stmt.where(Job.lease_expires_at < expired_before)
    values.setdefault("updated_at", utcnow())
    result = session.execute(stmt.values(**values).execution_options(synchronize_session=False))
    changed = _rowcount(result) == 1
    job = session.get(Job, job_id)
    if job is not None:
        session.refresh(job)
    return changed


def expired_leases(session: Session, now: dt.datetime, limit: int = 100) -> list[Job]:
    """Leased or running jobs whose lease ran out (row-locked on PostgreSQL)."""
    stmt = (
        select(Job)
        .where(Job.state.in_(ACTIVE_STATES), Job.lease_expires_at < now)
        .order_by(Job.lease_expires_at)
        .limit(limit)
    )
    return list(session.scalars(_locking(session, stmt)))


def extend_active_leases(session: Session, until: dt.datetime) -> int:
    """Push every active lease's expiry to at least ``until``; returns how many moved."""
    stmt = (
        update(Job)
        .where(Job.state.in_(ACTIVE_STATES))
        .where((Job.lease_expires_at.is_(None)) | (Job.lease_expires_at < until))
        .values(lease_expires_at=until, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return _rowcount(session.execute(stmt))


def delete_jobs_of_run(session: Session, run_id: str) -> int:
    """Delete a run's jobs (their batches go by cascade)."""
    n = 0
    for job in session.scalars(select(Job).where(Job.run_id == run_id)):
        session.delete(job)
        n += 1
    session.flush()
    return n


# ------------------------------------------------------------------------------ batches


def add_batch(
    session: Session,
    job_id: str,
    batch_no: int,
    attempt: int,
    n_requests: int,
    request_indices: Sequence[int] | None = None,
) -> bool:
    """Record an uploaded batch (and the request indices it carries) in the caller's
    transaction; False (and nothing changed) when it was already recorded. The row commits
    or rolls back with whatever else the caller writes (the batch's requests)."""
    if batch_exists(session, job_id, batch_no):
        return False
    indices = [int(i) for i in request_indices] if request_indices is not None else None
    row = JobBatch(
        job_id=job_id,
        batch_no=batch_no,
        attempt=attempt,
        n_requests=n_requests,
        request_indices=indices,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:  # a concurrent retry of the same batch won the race
        return False
    return True


def batch_exists(session: Session, job_id: str, batch_no: int) -> bool:
    stmt = select(JobBatch.id).where(JobBatch.job_id == job_id, JobBatch.batch_no == batch_no)
    return session.scalar(stmt) is not None


def batch_numbers(session: Session, job_id: str) -> set[int]:
    return set(session.scalars(select(JobBatch.batch_no).where(JobBatch.job_id == job_id)))


def missing_numbers(first: int, end: int, present: Collection[int], limit: int) -> list[int]:
    """The first ``limit`` numbers of ``first..end-1`` not in ``present``, found without
    materializing the range (``end`` comes from a client: it may be 2^31)."""
    out: list[int] = []
    n = first
    while n < end and len(out) < limit:
        if n not in present:
            out.append(n)
        n += 1
    return out


def count_missing(first: int, end: int, present: Collection[int]) -> int:
    """How many numbers of ``first..end-1`` are not in ``present``."""
    return max(0, end - first) - sum(1 for p in set(present) if first <= p < end)


def batch_indices(session: Session, job_id: str) -> dict[int, list[int] | None]:
    """batch_no -> the request indices that batch declared (None: stored before 0009)."""
    stmt = select(JobBatch.batch_no, JobBatch.request_indices).where(JobBatch.job_id == job_id)
    return {int(no): (list(idx) if idx is not None else None) for no, idx in session.execute(stmt)}


def stored_indices(session: Session, run_id: str) -> set[int]:
    """The request indices stored for a run."""
    return set(session.scalars(select(Request.idx).where(Request.run_id == run_id)))


def count_batches(session: Session, job_id: str) -> int:
    stmt = select(func.count()).select_from(JobBatch).where(JobBatch.job_id == job_id)
    return int(session.scalar(stmt) or 0)


def measured_counts(session: Session, run_id: str) -> tuple[int, int]:
    """(measured requests stored, of which ok) for a run; warm-ups excluded."""
    stmt = select(func.count(), func.count().filter(Request.status == "ok")).where(
        Request.run_id == run_id, Request.warmup.is_(False)
    )
    row = session.execute(stmt).one()
    return int(row[0] or 0), int(row[1] or 0)


def sent_counts(session: Session, run_id: str) -> tuple[int, int, int]:
    """(measured requests sent, of which ok, of which cancelled) for a run; warm-ups and
    unsent excluded."""
    stmt = select(
        func.count(),
        func.count().filter(Request.status == "ok"),
        func.count().filter(Request.status == "cancelled"),
    ).where(Request.run_id == run_id, Request.warmup.is_(False), Request.sent_ns.is_not(None))
    row = session.execute(stmt).one()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


def stored_requests(session: Session, run_id: str) -> int:
    stmt = select(func.count()).select_from(Request).where(Request.run_id == run_id)
    return int(session.scalar(stmt) or 0)


# ------------------------------------------------------------------------------- shards


def shard_jobs(session: Session, run_id: str) -> list[Job]:
    """The jobs of a run dealt over workers, by shard ([] for any other run)."""
    stmt = (
        select(Job)
        .where(Job.run_id == run_id, Job.shard_idx.is_not(None))
        .order_by(Job.shard_idx)
        .execution_options(populate_existing=True)
    )
    return list(session.scalars(stmt))


def set_shard_start(session: Session, job_id: str, start_ns: int, phase: str = "run") -> int | None:
    """Set a job's ``shard_start_ns`` (phase "measure": ``shard_measure_ns``) unless it has
    one; returns the one it has now. The run's start is set on its first shard's job (one
    row: concurrent "ready" calls never lock two rows in opposite orders), then copied to
    each shard's as it learns it."""
    col = Job.shard_measure_ns if phase == "measure" else Job.shard_start_ns
    stmt = (
        update(Job)
        .where(Job.id == job_id, col.is_(None))
        .values({col: start_ns, Job.updated_at: utcnow()})
        .execution_options(synchronize_session=False)
    )
    session.execute(stmt)
    return session.scalar(
        select(col).where(Job.id == job_id).execution_options(populate_existing=True)
    )


def waiting_shard_runs(session: Session, queued_before: dt.datetime) -> list[str]:
    """Runs dealt over workers queued before ``queued_before`` whose shards have not all
    started (no common start yet) while some shard is still queued or active."""
    stmt = (
        select(Job.run_id)
        .where(
            Job.shard_idx.is_not(None),
            Job.shard_start_ns.is_(None),
            Job.state.in_(("queued", *ACTIVE_STATES)),
            Job.created_at < queued_before,
        )
        .distinct()
    )
    return [r for r in session.scalars(stmt) if r is not None]


def stored_by_shard(session: Session, run_id: str) -> dict[int, tuple[int, int]]:
    """Shard -> (requests stored, warm-ups included; measured ones ok) of a dealt run."""
    stmt = (
        select(
            Request.shard_idx,
            func.count(),
            func.count().filter(Request.status == "ok", Request.warmup.is_(False)),
        )
        .where(Request.run_id == run_id, Request.shard_idx.is_not(None))
        .group_by(Request.shard_idx)
    )
    return {int(k or 0): (int(n or 0), int(ok or 0)) for k, n, ok in session.execute(stmt)}
