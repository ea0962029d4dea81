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
from app.client.sessions import MAX_SESSION_TURNS
from app.domain import RunStatus
from app.protocol.wire import INT32_MAX, CompleteRequest, JobState, RunMeta
from app.services import workers as worker_svc
from app.services.auth import Principal
from app.services.errors import Conflict
from app.services.runs import finalize_run
from app.services.secretbox import SEALED
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import workers as worker_repo
from app.storage.jobs import ACTIVE_STATES
from app.storage.models import Job, utcnow

ACTIVE_RUN = (RunStatus.QUEUED, RunStatus.RUNNING)
TIMED_DATASETS = frozenset(name for name, kind in DATASETS.items() if kind.timed)


def _whole_trace(bench_spec: dict[str, Any]) -> bool:
    """A trace given no ``num_prompts``: it replays its every line, a count only the worker
    reading it learns."""
    return bench_spec.get("num_prompts") is None and bench_spec.get("dataset") in TIMED_DATASETS


def index_bound(bench_spec: dict[str, Any]) -> int:
    """How many request indexes a bench spec's run may use (a batch's indexes are
    0..bound-1): warm-ups plus ``num_prompts`` (a whole trace: ``num_prompts``' own maximum),
    or, for multi-turn sessions (``num_prompts`` counts sessions), warm-ups plus sessions x
    the turns one session may send (``max_turns``, else ``MAX_SESSION_TURNS``, where the
    worker cuts a conversation too). Never past what an index may hold (the wire's 2^31-1)."""
    n = MAX_NUM_PROMPTS if _whole_trace(bench_spec) else int(bench_spec.get("num_prompts") or 0)
    if bench_spec.get("multi_turn"):
        n *= int(bench_spec.get("max_turns") or MAX_SESSION_TURNS)
    return min(n + int(bench_spec.get("warmup_requests") or 0), INT32_MAX + 1)


def planned_of(bench_spec: dict[str, Any], reported: Any = None) -> int | None:
    """The requests a bench spec's run plans, warm-ups included. Multi-turn sessions and a
    whole trace: what the worker's plan holds (``reported``: the measured requests its
    progress or load counts say were planned, bounded by ``index_bound``), None while it has
    not said."""
    warmups = int(bench_spec.get("warmup_requests") or 0)
    if not bench_spec.get("multi_turn") and not _whole_trace(bench_spec):
        return int(bench_spec.get("num_prompts") or 0) + warmups
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        return min(reported + warmups, index_bound(bench_spec))
    return None


def planned_text(bench_spec: dict[str, Any], reported: Any = None) -> str:
    """ "24 planned requests", or for sessions whose turns were never reported "up to 80000
    planned requests (8 sessions of up to 10000 turns)"."""
    planned = planned_of(bench_spec, reported)
    if planned is not None:
        return f"{planned} planned requests"
    if not bench_spec.get("multi_turn"):
        return f"up to {index_bound(bench_spec)} planned requests (the whole trace)"
    sessions = int(bench_spec.get("num_prompts") or 0)
    turns = int(bench_spec.get("max_turns") or MAX_SESSION_TURNS)
    return (
        f"up to {index_bound(bench_spec)} planned requests "
        f"({sessions} sessions of up to {turns} turns)"
    )


def reported_planned(progress: Any, meta: RunMeta | None = None) -> Any:
    """The measured requests the worker said its run plans: its load counts at completion,
    else its last heartbeat's progress (None when it said nothing)."""
    counts = (meta.load_stats or {}).get("counts") if meta is not None else None
    if isinstance(counts, dict) and counts.get("planned") is not None:
        return counts.get("planned")
    return progress.get("planned") if isinstance(progress, dict) else None


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


def end_leased_job(
    session: Session,
    job: Job,
    lease_id: str,
    state: JobState,
    error: str | None,
    now: Any,
    **values: Any,
) -> None:
    """Move a job whose lease ``lease_id`` holds to its terminal ``state`` (its spec made
    public, ``values`` besides), or a ``Conflict`` when the lease was lost meanwhile; its
    worker is free again. The caller commits."""
    changed = job_repo.transition(
        session,
        job.id,
        from_states=ACTIVE_STATES,
        holding_lease=lease_id,
        state=state,
        error=error,
        finished_at=now,
        lease_expires_at=None,
        spec=public_spec(job.spec),
        **values,
    )
    if not changed:
        raise Conflict(f"lease lost: job {job.id!r} changed while completing")
    if job.worker_id:
        worker_repo.seen(session, job.worker_id, now, current_job_id=None)


@dataclass(frozen=True)
class Outcome:
    job_state: JobState
    run_status: RunStatus
    error: str | None
    notes: list[str]
    lost: int = 0  # requests the target was sent (or the worker recorded) that were not stored


MAX_NAMED = 20  # indices or batch numbers named in a note; the rest are counted
MAX_MISSING_NAMED = 1000  # batch numbers a "batches missing" 409 names (the worker resends)


def _named(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:MAX_NAMED])
    more = len(numbers) - MAX_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Arrival:
    """What did not arrive of a job's uploads: the notes saying so, and how many requests
    that is at least (each missing index, and one for each batch that never arrived)."""

    notes: list[str]
    lost: int


def arrival_check(session: Session, job: Job, run_id: str, total_batches: int | None) -> Arrival:
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
    return Arrival(["; ".join(parts)] if parts else [], len(missing) + n_lost)


def with_loss(outcome: Outcome, notes: list[str], lost: int) -> Outcome:
    """A run that lost uploaded data is ``partial`` (a failed one stays failed), its notes
    say what, and it counts ``lost`` (the larger of what each check found: they overlap)."""
    if not notes and lost <= outcome.lost:
        return outcome
    status = RunStatus.PARTIAL if outcome.run_status is RunStatus.SUCCEEDED else outcome.run_status
    return Outcome(
        outcome.job_state, status, outcome.error, outcome.notes + notes, max(outcome.lost, lost)
    )


def unstored(session: Session, run_id: str, records: int | None) -> tuple[list[str], int]:
    """The requests the worker says it recorded (``records``: every batch's, uploaded or
    not) that are not stored: a note and their count (none when it did not say)."""
    if records is None:
        return [], 0
    lost = records - job_repo.stored_requests(session, run_id)
    if lost <= 0:
        return [], 0
    return [f"{lost} of {records} requests the worker recorded were not stored"], lost


def process_lost(meta: RunMeta | None) -> int:
    """Requests a load process that died on the worker never recorded (a run over several
    processes, ``app.client.shards``: ``load_stats.counts.lost``); 0 when it says none."""
    counts = meta.load_stats.get("counts") if meta is not None else None
    n = counts.get("lost") if isinstance(counts, dict) else None
    if not isinstance(n, int) or isinstance(n, bool):
        return 0
    return max(0, min(n, MAX_NUM_PROMPTS))


def worker_lost_count(session: Session, run_id: str, progress: Any) -> int:
    """Requests a lost worker had sent (its last heartbeat's measured ``sent``) beyond the
    measured requests stored: the target saw them, the run never got them."""
    sent = progress.get("sent") if isinstance(progress, dict) else None
    if not isinstance(sent, int) or isinstance(sent, bool):
        return 0
    return max(0, sent - job_repo.sent_counts(session, run_id)[0])


def decide(
    session: Session,
    job: Job,
    run_id: str | None,
    status_: Literal["succeeded", "failed", "cancelled"],
    error_: str | None,
    meta: RunMeta | None,
    *,
    bench_spec: dict[str, Any],
    records: int | None = None,
) -> Outcome:
    """The job's end state and ``run_id``'s status from what the worker reported
    (``bench_spec``: the run's spec, whose plan the notes name; ``records``: the requests
    the worker recorded, uploaded or not: any of them not stored makes the run ``partial``
    and counted as lost)."""
    stored = job_repo.stored_requests(session, run_id) if run_id else 0
    planned = planned_text(bench_spec, reported_planned(job.progress, meta))
    loss, lost = unstored(session, run_id, records) if run_id else ([], 0)
    lost += process_lost(meta)  # notes of their own are in the run's validity already
    if job.cancel_requested or status_ == "cancelled":  # cancelled, whatever it stored
        note = f"cancelled: {stored} of {planned} were stored"
        return Outcome("cancelled", RunStatus.CANCELLED, None, [note, *loss], lost)
    sent, ok, cut = job_repo.sent_counts(session, run_id) if run_id else (0, 0, 0)
    stopped = (meta.load_stats.get("stopped") if meta else None) == "stopped"
    run = repo.find_run(session, run_id) if run_id else None
    bound = spec_error_bound(run.spec if run is not None else None)
    tallied = RequestTally(sent, ok, cut)
    status = run_status(tallied, stopped=stopped, max_error_rate=bound, lost=lost)
    if status_ == "failed":
        error = error_ or "the worker reported a failure"
        if meta is None or lost:  # the load broke, or its results did: what was stored is a part
            status = RunStatus.PARTIAL if stored else RunStatus.FAILED
        note = f"failed on the worker: {error} ({stored} of {planned} stored)"
        return Outcome("failed", status, error, [note, *loss], lost)
    return with_loss(Outcome("succeeded", status, None, []), loss, lost)


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
        lost_requests=outcome.lost,
    )
