"""Job kind ``bench``: one run's load on a worker (``JobKindRules``, ``app.services.job_kinds``).

Its batches all go to the job's run, numbered from 0; completing it checks that every batch
and every request index declared in them arrived exactly once (else the run is
``partial`` and says what is missing), stamps the worker, stores the target's /metrics
series, and finalizes the run. ``SingleRunKind`` is the same life for a kind whose job may
have no run (``probe``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.wire import (
    CompleteRequest,
    CompleteResponse,
    JobKind,
    JobRequirements,
    ResultBatch,
    SweepResume,
)
from app.services import sharded_sweeps
from app.services.hardware import stamp_meta
from app.services.job_rules import (
    ACTIVE_RUN,
    MAX_MISSING_NAMED,
    Arrival,
    Outcome,
    arrival_check,
    decide,
    end_leased_job,
    finalize_outcome,
    with_loss,
    worker_lost_count,
)
from app.services.secretbox import SecretBox
from app.services.server_metrics import store_wire
from app.services.shard_jobs import complete_shard, create_shard_jobs, finish_if_done
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, utcnow


def bench_job_spec(spec: RunSpec, box: SecretBox) -> dict[str, Any]:
    """What a worker needs: the spec as JSON plus the API key (excluded from dumps), sealed."""
    out: dict[str, Any] = json_safe(spec.model_dump(mode="json"))
    if spec.api_key:
        out["api_key"] = spec.api_key
    return box.seal_spec(out)


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
    if spec.shards > 1:  # K leases of one run (app.services.shard_jobs)
        first = create_shard_jobs(
            session,
            spec,
            bench_job_spec(spec, box),
            requirements=requirements.model_dump(mode="json"),
            run_id=run_id,
            max_attempts=max_attempts,
        )
        return run_id, first
    job = job_repo.create_job(
        session,
        kind="bench",
        spec=bench_job_spec(spec, box),
        requirements=requirements.model_dump(mode="json"),
        run_id=run_id,
        max_attempts=max_attempts,
    )
    return run_id, job.id


class SingleRunKind:
    """A job with at most one run (the job's own), batches numbered from 0."""

    name: JobKind

    def __init__(self, name: JobKind) -> None:
        self.name = name

    def bench_spec(self, job: Job) -> dict[str, Any]:
        return dict(job.spec or {}) if self.name == "bench" else {}

    def lease_resume(self, session: Session, job: Job) -> SweepResume | None:
        return None

    def batch_run(self, session: Session, job: Job, batch: ResultBatch) -> str | None:
        return job.run_id

    def missing_batches(self, session: Session, job: Job, total_batches: int) -> list[int]:
        present = job_repo.batch_numbers(session, job.id)
        return job_repo.missing_numbers(0, total_batches, present, MAX_MISSING_NAMED)

    def _outcome(self, session: Session, job: Job, req: CompleteRequest) -> Outcome:
        outcome = decide(
            session,
            job,
            job.run_id,
            req.status,
            req.error,
            req.run_meta,
            bench_spec=self.bench_spec(job),
            records=req.records,
        )
        if job.run_id is None:
            return outcome
        arrival = arrival_check(session, job, job.run_id, req.total_batches)
        return with_loss(outcome, arrival.notes, arrival.lost)

    def recomplete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> None:
        if job.shard_idx is not None and job.run_id is not None:  # a shard: the run's end
            if finish_if_done(sessions, job.run_id):
                sharded_sweeps.after_run(sessions, job.run_id)  # a sweep's step: go on
            return
        run = repo.find_run(session, job.run_id) if job.run_id else None
        if run is not None and run.status in ACTIVE_RUN:  # the first try failed mid-way
            outcome = self._outcome(session, job, req)
            session.commit()
            finalize_outcome(sessions, run.id, outcome, req)

    def complete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> CompleteResponse:
        outcome = self._outcome(session, job, req)
        if job.shard_idx is not None:  # one shard of a run dealt over workers
            done = complete_shard(session, sessions, job, req, outcome)
            if job.run_id is not None:  # a sweep's step whose run ended: the sweep goes on
                sharded_sweeps.after_run(sessions, job.run_id)
            return done
        now = utcnow()
        end_leased_job(session, job, req.lease_id, outcome.job_state, outcome.error, now)
        if job.run_id is not None and req.run_meta is not None:
            stamp_meta(session, job.worker_id, req.run_meta)  # which worker (and GPUs) ran it
            meta = req.run_meta
            changes = {"client_host": meta.client_host, "client_version": meta.client_version}
            repo.update_run(session, job.run_id, **{k: v for k, v in changes.items() if v})
        if job.run_id is not None and req.server_metrics:
            store_wire(session, job.run_id, req.server_metrics)
        session.commit()
        if job.run_id is not None:
            finalize_outcome(sessions, job.run_id, outcome, req)
        return CompleteResponse(job_id=job.id, state=outcome.job_state, run_id=job.run_id)

    def kept_uploads(self, session: Session, job: Job) -> int:
        return job_repo.count_batches(session, job.id)

    def resumes_after_loss(self, job: Job) -> bool:
        return False

    def loss(self, session: Session, job: Job) -> Arrival:
        if job.run_id is None:
            return Arrival([], 0)
        arrival = arrival_check(session, job, job.run_id, None)
        gone = worker_lost_count(session, job.run_id, job.progress)
        if gone > arrival.lost:
            note = f"{gone} requests the worker had sent (its last heartbeat) were not stored"
            return Arrival([*arrival.notes, note], gone)
        return arrival

    def after_loss(self, session: Session, job: Job, outcome: str) -> list[tuple[str, Outcome]]:
        return []


BENCH = SingleRunKind("bench")
