"""A run dealt over workers (``RunSpec.shards``, docs/scale.md) on the server: K bench
jobs of one run, each a lease matched by the run's requirements as any job is, each
knowing its shard (``jobs.shard_idx``).

* **Ready, then one start.** A shard's worker builds its share and calls ``ready`` until
  the answer carries the start: once all K are leased and ready, the server sets one
  instant on its wall clock, ``now + START_MARGIN_NS``, on every shard
  (``jobs.shard_start_ns``). Not all ready within ``Settings.shard_wait_s`` of being
  queued: the run fails, "k of K shards leased" (``expire_waits``).
* **Warm-ups, then one measured start.** With warm-ups, each shard calls ``ready`` again
  (phase "measure") once its warm-ups ended; once every live shard's have (a lost shard
  is not waited for; after ``shard_wait_s`` the laggards are not either), one instant
  starts every shard's measured phase (``jobs.shard_measure_ns``).
* **One run.** Each shard uploads its batches as any job does (the server stamps the
  shard on each request); a shard's completion stores its end (``jobs.progress``); the last
  one to end finalizes the run with every shard's figures merged (``shard_merge``).
* **A lost shard** (lease expired after the start) ends failed; the run ends partial once
  the others end, its lost requests counted and said. **Cancel** flags every shard.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.wire import CompleteRequest, CompleteResponse, RunMeta, ShardReady, ShardStart
from app.services.auth import Principal
from app.services.errors import Conflict
from app.services.job_rules import ACTIVE_RUN, Outcome, end_leased_job, leased_job, public_spec
from app.services.runs import finalize_run
from app.services.shard_merge import ShardEnd, merge_shards
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.jobs import ACTIVE_STATES, TERMINAL_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, utcnow

START_MARGIN_NS = 400_000_000  # from the last shard's "ready" to the common start
END_KEY = "shard_end"  # jobs.progress: a completed shard's outcome and metadata


def create_shard_jobs(
    session: Session,
    spec: RunSpec,
    job_spec: dict[str, Any],
    *,
    requirements: dict[str, Any],
    run_id: str,
    max_attempts: int,
) -> str:
    """The run's K jobs, shard 0 first; returns shard 0's job id."""
    first = ""
    for k in range(spec.shards):
        job = job_repo.create_job(
            session,
            kind="bench",
            spec=job_spec,
            requirements=requirements,
            run_id=run_id,
            max_attempts=max_attempts,
        )
        job.shard_idx = k
        first = first or job.id
    session.flush()
    return first


def _counts(jobs: list[Job]) -> tuple[int, int]:
    leased = sum(1 for j in jobs if j.state in ACTIVE_STATES)
    ready = sum(1 for j in jobs if j.state in ACTIVE_STATES and j.shard_ready_at is not None)
    return leased, ready


def waiting_text(jobs: list[Job]) -> str | None:
    """ "k of K shards leased" while a dealt run waits for its common start (else None)."""
    if not jobs or any(j.shard_start_ns is not None for j in jobs):
        return None
    if any(j.state in TERMINAL_STATES for j in jobs):
        return None
    leased, ready = _counts(jobs)
    return f"{leased} of {len(jobs)} shards leased ({ready} ready)"


def ready(
    session: Session,
    job_id: str,
    req: ShardReady,
    principal: Principal,
    wait_s: float | None = None,
) -> ShardStart:
    """A shard's worker is ready; the answer has the common start once every shard is.
    Phase "measure" (its warm-ups ended): the measured phase's start (``_ready_measure``)."""
    job = leased_job(session, job_id, req.lease_id, principal)
    if job.shard_idx is None or job.run_id is None:
        raise Conflict(f"job {job_id!r} is not a shard of a run dealt over workers")
    if req.phase == "measure":
        return _ready_measure(session, job, req.lease_id, wait_s)
    if job.shard_ready_at is None:
        job_repo.transition(
            session, job.id, from_states=ACTIVE_STATES, holding_lease=req.lease_id,
            shard_ready_at=utcnow(),
        )  # fmt: skip
    jobs = job_repo.shard_jobs(session, job.run_id)
    leased, n_ready = _counts(jobs)
    start = next((j.shard_start_ns for j in jobs if j.shard_start_ns is not None), None)
    if start is None and n_ready == len(jobs):  # the first shard's row holds the run's start
        start = job_repo.set_shard_start(session, jobs[0].id, time.time_ns() + START_MARGIN_NS)
    if start is not None and job.shard_start_ns is None:  # this shard has learnt it
        job_repo.set_shard_start(session, job.id, start)
    return ShardStart(start_ns=start, leased=leased, ready=n_ready, shards=len(jobs))


def _ready_measure(session: Session, job: Job, lease_id: str, wait_s: float | None) -> ShardStart:
    """A shard's warm-ups ended. Once every live shard's have (a shard that ended, lost
    or failed, is not waited for), or ``wait_s`` after the first shard's did, the measured
    phase's common start is set, ``START_MARGIN_NS`` ahead, as the run's start is."""
    now = utcnow()
    if job.shard_warm_at is None:
        job_repo.transition(
            session, job.id, from_states=ACTIVE_STATES, holding_lease=lease_id,
            shard_warm_at=now,
        )  # fmt: skip
    assert job.run_id is not None
    jobs = job_repo.shard_jobs(session, job.run_id)
    live = [j for j in jobs if j.state in ACTIVE_STATES]
    warm = [j for j in live if j.shard_warm_at is not None]
    start = next((j.shard_measure_ns for j in jobs if j.shard_measure_ns is not None), None)
    first = min((j.shard_warm_at for j in warm if j.shard_warm_at), default=now)
    waited_out = wait_s is not None and (now - first).total_seconds() >= wait_s
    if start is None and (len(warm) == len(live) or waited_out):
        start = job_repo.set_shard_start(
            session, jobs[0].id, time.time_ns() + START_MARGIN_NS, "measure"
        )
    if start is not None and job.shard_measure_ns is None:
        job_repo.set_shard_start(session, job.id, start, "measure")
    return ShardStart(start_ns=start, leased=len(live), ready=len(warm), shards=len(jobs))


def expire_waits(sessions: sessionmaker[Session], wait_s: float) -> list[str]:
    """Fail every dealt run whose shards were not all leased and ready within ``wait_s`` of
    being queued: its jobs end failed, the run failed, both saying "k of K shards leased"."""
    failed: list[str] = []
    cutoff = utcnow() - dt.timedelta(seconds=wait_s)
    with session_scope(sessions) as s:
        run_ids = job_repo.waiting_shard_runs(s, cutoff)
    for run_id in run_ids:
        with session_scope(sessions) as s:
            jobs = job_repo.shard_jobs(s, run_id)
            if any(j.shard_start_ns is not None for j in jobs):
                continue
            leased, _ = _counts(jobs)
            error = f"{leased} of {len(jobs)} shards leased within {wait_s:g} s"
            now = utcnow()
            for j in jobs:
                job_repo.transition(
                    s, j.id, from_states=("queued", *ACTIVE_STATES), state="failed",
                    error=error, finished_at=now, lease_expires_at=None,
                    spec=public_spec(j.spec),
                )  # fmt: skip
                if j.worker_id:
                    worker_repo.seen_job_done(s, j.worker_id, j.id)
        finalize_run(sessions, run_id, status=RunStatus.FAILED, meta=None, extra_notes=[error])
        failed.append(run_id)
    return failed


def complete_shard(
    session: Session,
    sessions: sessionmaker[Session],
    job: Job,
    req: CompleteRequest,
    outcome: Outcome,
) -> CompleteResponse:
    """End one shard's job, keeping its outcome; the last shard to end finalizes the run."""
    end = {
        "run_status": outcome.run_status.value,
        "notes": outcome.notes,
        "lost": outcome.lost,
        "meta": req.run_meta.model_dump(mode="json") if req.run_meta is not None else None,
    }
    now = utcnow()
    end_leased_job(
        session, job, req.lease_id, outcome.job_state, outcome.error, now,
        progress=json_safe({**(job.progress or {}), END_KEY: end}),
    )  # fmt: skip
    session.commit()
    assert job.run_id is not None
    finish_if_done(sessions, job.run_id)
    return CompleteResponse(job_id=job.id, state=outcome.job_state, run_id=job.run_id)  # type: ignore[arg-type]


def _end_of(job: Job, stored: dict[int, tuple[int, int]]) -> ShardEnd:
    k = int(job.shard_idx or 0)
    end = (job.progress or {}).get(END_KEY)
    n, ok = stored.get(k, (0, 0))
    if not isinstance(end, dict):  # it never completed: lost, failed by the server, cancelled
        return ShardEnd(k, job.state, job.error, None, [], 0, None, n, ok, job.worker_id)
    meta = RunMeta.model_validate(end["meta"]) if end.get("meta") else None
    return ShardEnd(
        k, job.state, job.error, RunStatus(end["run_status"]), list(end.get("notes") or []),
        int(end.get("lost") or 0), meta, n, ok, job.worker_id,
    )  # fmt: skip


def finish_if_done(sessions: sessionmaker[Session], run_id: str) -> bool:
    """Finalize a dealt run once every shard's job ended (once: a run already ended stays)."""
    with session_scope(sessions) as s:
        jobs = job_repo.shard_jobs(s, run_id)
        run = repo.find_run(s, run_id)
        if not jobs or any(j.state not in TERMINAL_STATES for j in jobs):
            return False
        if run is None or run.status not in ACTIVE_RUN:
            return False
        stored = job_repo.stored_by_shard(s, run_id)
        ends = [_end_of(j, stored) for j in jobs]
        spec = dict(run.spec or {})
    status, notes, lost, meta = merge_shards(ends, spec)
    finalize_run(sessions, run_id, status=status, meta=meta, extra_notes=notes, lost_requests=lost)
    return True


def cancel_shards(session: Session, run_id: str, jobs: list[Job]) -> str:
    """Cancel every shard: queued ones now, leased ones at their next heartbeat. Returns the
    state the run's jobs are in ("cancelled" when none had been leased)."""
    now = utcnow()
    active = False
    for j in jobs:
        if j.state == "queued":
            job_repo.transition(
                session, j.id, from_states=("queued",), state="cancelled", finished_at=now,
                spec=public_spec(j.spec),
            )  # fmt: skip
        elif j.state in ACTIVE_STATES:
            active = True
            job_repo.transition(session, j.id, from_states=ACTIVE_STATES, cancel_requested=True)
    if not active:
        run = repo.find_run(session, run_id)
        validity = [*((run.validity or []) if run else []), "cancelled before it started"]
        repo.finish_run(session, run_id, status=RunStatus.CANCELLED, finished_at=now,
                        validity=validity)  # fmt: skip
        return "cancelled"
    return "running"
