"""Store the batches a worker kept (``app.worker.spool``, ``kept/<job>-a<attempt>``) into
their runs: what the server once refused (a body over its limit, a bug since fixed) or never
got (the lease was lost before they were sent), recovered by ``tokentrace recover``.

The batches go through the same checks as an upload (``app.services.jobs.batch_records``:
indexes within the spec's bound, once each, decodable events) and the same idempotent
bookkeeping (a batch number already stored is skipped, a request index already stored is
kept as it was), so recovering twice stores nothing twice. Only the attempt that the job
ended on may be recovered, once the job has ended: an earlier attempt's requests were
superseded when the job was requeued, and a live job's worker still sends its own. Each run
that got requests back has its lost count lowered by as many, a note saying so, and its
summary recomputed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from app.protocol.wire import ResultBatch
from app.services.errors import Conflict, Invalid, NotFound
from app.services.job_kinds import rules_of
from app.services.jobs import batch_records
from app.services.runs import store_requests, store_summaries
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jobs import ACTIVE_STATES
from app.storage.models import Job


@dataclass
class Recovered:
    """What a recovery stored: requests newly stored per run, batches already stored."""

    stored: Counter[str] = field(default_factory=Counter)
    duplicate_batches: int = 0
    batches: int = 0


def _check_job(session: Session, job_id: str, attempt: int) -> Job:
    job = job_repo.get_job(session, job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} does not exist (any more): there is no run to recover into")
    if job.state in ACTIVE_STATES:
        raise Conflict(
            f"job {job_id!r} is still {job.state}: its worker sends its own batches; "
            "recover once it has ended"
        )
    if job.attempt != attempt:
        raise Conflict(
            f"these batches are of attempt {attempt} of job {job_id!r}, which ended on attempt "
            f"{job.attempt}: the job was requeued and its run re-measured, so they are not "
            "part of it"
        )
    return job


def _run_of(session: Session, job: Job, batch: ResultBatch) -> str:
    """The run a kept batch belongs to, as its upload would have found it."""
    if job.kind == "sweep":
        return rules_of(job).batch_run(session, job, batch) or ""
    if job.run_id is None:
        raise Conflict(f"job {job.id!r} has no run to store results in")
    return job.run_id


def recover_batches(
    sessions: sessionmaker[Session], job_id: str, attempt: int, batches: Iterable[ResultBatch]
) -> Recovered:
    """Store ``batches`` (kept by attempt ``attempt`` of ``job_id``) into their runs, one
    transaction per batch, then lower each run's lost count and recompute its summary."""
    out = Recovered()
    with session_scope(sessions) as s:
        _check_job(s, job_id, attempt)
    for batch in batches:
        out.batches += 1
        with session_scope(sessions) as s:
            job = _check_job(s, job_id, attempt)
            run_id = _run_of(s, job, batch)
            if job_repo.batch_exists(s, job_id, batch.batch_no):
                out.duplicate_batches += 1
                continue
            records = batch_records(job, batch)
            indices = [r.index for r in records]
            job_repo.add_batch(s, job_id, batch.batch_no, attempt, len(records), indices)
            before = job_repo.stored_requests(s, run_id)
            try:
                store_requests(s, run_id, records)
            except (ValueError, TypeError) as e:
                raise Invalid(f"batch {batch.batch_no}: {e}", loc=("batch", batch.batch_no)) from e
            out.stored[run_id] += job_repo.stored_requests(s, run_id) - before
    for run_id, n in out.stored.items():
        if n <= 0:
            continue
        with session_scope(sessions) as s:
            run = repo.get_run(s, run_id)
            note = f"recovered {n} requests from the worker's kept spool (job {job_id})"
            repo.update_run(
                s,
                run_id,
                lost_requests=max(0, int(run.lost_requests or 0) - n),
                validity=[*(run.validity or []), note],
            )
        store_summaries(sessions, run_id)
    return out
