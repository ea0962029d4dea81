"""The rules every job kind shares: a job's live lease, its planned requests, the outcome a
completion or a lost lease gives its run, and what did not arrive.

Pure of any kind: the kinds (``app.services.job_kinds``) and the job lifecycle
(``app.services.jobs``) build on these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.trust import RequestTally, run_status, spec_error_bound
from app.client.datasets import DATASETS
from app.client.datasets.base import MAX_NUM_PROMPTS
from app.domain import RunStatus
from app.protocol.wire import CompleteRequest, JobState, RunMeta
from app.services import workers as worker_svc
from app.services.auth import Principal
from app.services.errors import Conflict
from app.services.runs import finalize_run
from app.services.secretbox import SEALED
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.jobs import ACTIVE_STATES
from app.storage.models import Job, utcnow

ACTIVE_RUN = (RunStatus.QUEUED, RunStatus.RUNNING)
TIMED_DATASETS = frozenset(name for name, kind in DATASETS.items() if kind.timed)


def planned_of(bench_spec: dict[str, Any]) -> int:
    """The requests a bench spec plans, warm-ups included (what batch indexes count). A
    trace given no ``num_prompts`` replays its every line, a count only the worker reading
    it learns: bounded here by ``num_prompts``' own maximum."""
    n = bench_spec.get("num_prompts")
    if n is None and bench_spec.get("dataset") in TIMED_DATASETS:
        n = MAX_NUM_PROMPTS
    return int(n or 0) + int(bench_spec.get("warmup_requests") or 0)


def public_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A job spec without secrets, for listings."""
    return {k: v for k, v in spec.items() if k not in ("api_key", SEALED)}


def leased_job(session: Session, job_id: str, lease_id: str, principal: Principal) -> Job:
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


@dataclass(frozen=True)
class Outcome:
    job_state: JobState
    run_status: RunStatus
    error: str | None
    notes: list[str]


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
    *,
    planned: int,
) -> Outcome:
    """The job's end state and ``run_id``'s status from what the worker reported
    (``planned``: the requests the run's spec planned, for the notes)."""
    stored = job_repo.stored_requests(session, run_id) if run_id else 0
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


def finalize_outcome(
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


