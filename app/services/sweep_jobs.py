"""Sweeps on workers (job kind ``sweep``): queue one, let the leasing worker create each
step's run as it goes, finalize each step, and end the sweep with why it stopped.

The worker drives the plan with ``app.client.sweep_plan.drive`` (the same planning and
saturation rules as a local sweep); the server stores what it reports. Protocol in
``app.protocol.wire``.

A lost lease with attempts left requeues the job (``expired``): each completed step keeps
its run and the summary the worker was answered; the next attempt's lease carries them
(``resume_of``) for its worker to replay, so the sweep goes on from where it stopped and
decides as it would have. The interrupted step is re-run as a new run in the same step slot
(``create_step``); its old run is kept as a standalone run with notes saying why.

Functions take the request's ``Session`` and never commit it, except step and sweep
completion, which commit before ``finalize_run`` (it uses sessions of its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.slo_search import FindMax, find_max_of
from app.analysis.sweep import LoadKind
from app.client import sweep_plan
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.wire import (
    CompleteRequest,
    CompleteResponse,
    JobKind,
    JobRequirements,
    JobState,
    ResultBatch,
    ResumedStep,
    StepComplete,
    StepCompleted,
    StepCreate,
    StepCreated,
    SweepResume,
)
from app.services import hardware, sharded_sweeps
from app.services.auth import Principal
from app.services.errors import Conflict, Invalid, NotFound
from app.services.job_rules import (
    ACTIVE_RUN,
    MAX_MISSING_NAMED,
    Arrival,
    Outcome,
    decide,
    end_leased_job,
    leased_job,
    public_spec,
    worker_lost_count,
)
from app.services.runs import finalize_run
from app.services.secretbox import SecretBox
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jobs import ACTIVE_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, utcnow
from app.storage.models_compare import SweepStep


def create_sweep_job(
    session: Session,
    spec: RunSpec,
    plan: sweep_plan.SweepPlan,
    *,
    requirements: JobRequirements,
    name: str | None,
    max_attempts: int,
    box: SecretBox,
) -> tuple[str, str]:
    """The sweep (status queued) and its one ``sweep`` job, in the caller's transaction:
    (sweep_id, job_id). The API key travels at the top of the job spec, sealed (``box``).
    ``shards`` > 1: the server sequences steps dealt over workers (``sharded_sweeps``)."""
    if spec.shards > 1:  # the job answered is step 0's shard 0
        reqs, attempts = requirements, max_attempts
        return sharded_sweeps.create(session, spec, plan, requirements=reqs, name=name,
                                     max_attempts=attempts, box=box)  # fmt: skip
    sweep_id = compare_repo.create_sweep(
        session,
        spec=spec.model_dump(mode="json"),
        mode=plan.mode,
        loads=list(plan.loads),
        name=name,
        status="queued",
        find_max=None if plan.find_max is None else plan.find_max.to_dict(),
    )
    job_spec: dict[str, Any] = {
        "sweep_id": sweep_id,
        "name": name or f"sweep {sweep_id}",
        "plan": sweep_plan.plan_dict(plan),
        "bench": json_safe(spec.model_dump(mode="json")),
    }
    if spec.api_key:
        job_spec["api_key"] = spec.api_key
    job = job_repo.create_job(
        session,
        kind="sweep",
        spec=box.seal_spec(job_spec),
        requirements=requirements.model_dump(mode="json"),
        run_id=None,
        max_attempts=max_attempts,
    )
    compare_repo.update_sweep(session, sweep_id, job_id=job.id)
    return sweep_id, job.id


def _find_max(job: Job) -> FindMax | None:
    """The find-max search of a sweep job's plan, else None."""
    plan = (job.spec or {}).get("plan")
    fm = plan.get("find_max") if isinstance(plan, dict) else None
    return find_max_of(fm) if isinstance(fm, dict) else None


def _sweep_id(job: Job) -> str:
    return str((job.spec or {}).get("sweep_id") or "")


def _sweep_job(session: Session, job_id: str, lease_id: str, principal: Principal) -> Job:
    job = leased_job(session, job_id, lease_id, principal)
    if job.kind != "sweep":
        raise Conflict(f"job {job_id!r} is a {job.kind} job, not a sweep")
    return job


def _step(session: Session, sweep_id: str, step_idx: int) -> SweepStep | None:
    for st in compare_repo.sweep_steps(session, sweep_id):
        if st.step_idx == step_idx:
            return st
    return None


def step_count(session: Session, job: Job) -> int:
    return len(compare_repo.sweep_steps(session, _sweep_id(job)))


def _completed(steps: list[SweepStep]) -> list[SweepStep]:
    """The steps completed so far: the leading ones with a stored summary."""
    out: list[SweepStep] = []
    for st in steps:
        if st.summary is None or st.step_idx != len(out):
            break
        out.append(st)
    return out


def resume_of(session: Session, job: Job) -> SweepResume | None:
    """What the worker of a sweep job's attempt >= 2 needs to go on where the sweep stopped:
    the completed steps to replay and the first batch number to use (None: attempt 1)."""
    if job.kind != "sweep" or job.attempt < 2:
        return None
    done = [
        ResumedStep(
            step_idx=st.step_idx,
            run_id=st.run_id,
            load=None if st.load < 0 else st.load,
            load_kind="concurrency" if st.load_kind == "concurrency" else "rate",
            role="probe" if st.role == "probe" else "step",
            summary=dict(st.summary or {}),
        )
        for st in _completed(compare_repo.sweep_steps(session, _sweep_id(job)))
    ]
    return SweepResume(
        completed=done, first_batch_no=compare_repo.first_batch_no(session, job.id, job.attempt)
    )


def missing_batches(session: Session, job: Job, total_batches: int) -> list[int]:
    """Batch numbers this attempt sent (``first_batch_no..total_batches-1``) that have not
    arrived; earlier attempts' numbers are theirs."""
    first = compare_repo.first_batch_no(session, job.id, job.attempt)
    present = job_repo.batch_numbers(session, job.id)
    return job_repo.missing_numbers(first, total_batches, present, MAX_MISSING_NAMED)


# ------------------------------------------------------------------------------ steps


def create_step(
    session: Session, job_id: str, req: StepCreate, principal: Principal
) -> StepCreated:
    """Create step ``step_idx``'s run (status running) under the job's lease; a retry of the
    same step within the attempt answers the run already made. A step an earlier attempt
    left unfinished (its worker was lost) gets a new run in the same slot; its old run is
    kept on its own, with a note naming the new one."""
    job = _sweep_job(session, job_id, req.lease_id, principal)
    sweep_id = _sweep_id(job)
    found = _step(session, sweep_id, req.step_idx)
    if found is not None and found.attempt >= job.attempt:
        return StepCreated(run_id=found.run_id, step_idx=req.step_idx)
    if found is not None and found.summary is not None:
        raise Invalid(
            f"step_idx: step {req.step_idx} was completed on attempt {found.attempt} "
            "(sent with the lease in resume): replay it, do not run it again",
            loc=("body", "step_idx"),
        )
    load = math.inf if req.load is None else float(req.load)
    if math.isinf(load) and req.load_kind != "rate":
        raise Invalid("load: only a rate may be unlimited (null)", loc=("body", "load"))
    if req.load_kind == "concurrency" and load != int(load):
        raise Invalid("load: a concurrency must be a whole number", loc=("body", "load"))
    data = dict(job.spec.get("bench") or {})
    if data.get("request_rate") is None:  # JSON has no infinity: unlimited arrives as null
        data.pop("request_rate", None)
    base = RunSpec.model_validate(data)  # the step run's spec: its dump never has the key
    try:
        spec = sweep_plan.step_spec(base, load, req.load_kind)
    except ValueError as e:
        raise Invalid(f"load: {e}", loc=("body", "load")) from None
    now = utcnow()
    name = f"{job.spec.get('name')} · {sweep_plan.step_label(load, req.load_kind)}"
    run_id = repo.create_run(session, spec, source="bench", name=name, status=RunStatus.RUNNING)
    repo.start_run(session, run_id, started_at=now)
    stored_load = -1.0 if math.isinf(load) else load
    if found is None:
        compare_repo.add_step(
            session,
            sweep_id,
            step_idx=req.step_idx,
            run_id=run_id,
            load=stored_load,
            load_kind=req.load_kind,
            role=req.role,
            attempt=job.attempt,
        )
    else:
        _supersede(session, sweep_id, found.run_id, req.step_idx, run_id, job.attempt)
        compare_repo.repoint_step(
            session,
            found.id,
            run_id=run_id,
            load=stored_load,
            load_kind=req.load_kind,
            role=req.role,
            attempt=job.attempt,
        )
    changes: dict[str, Any] = {"status": "running"}
    if req.planned_loads is not None:
        changes["loads"] = [float(x) for x in req.planned_loads]
    compare_repo.update_sweep(session, sweep_id, **changes)
    return StepCreated(run_id=run_id, step_idx=req.step_idx)


def _supersede(
    session: Session, sweep_id: str, old_run: str, step_idx: int, new_run: str, attempt: int
) -> None:
    """Note on the interrupted step's old run (kept, no longer part of the sweep) that a new
    run replaced it; one still active (its finalization after the lost lease failed) ends."""
    run = repo.find_run(session, old_run)
    if run is None:
        return
    note = (
        f"superseded: the worker was lost during step {step_idx} of sweep {sweep_id}; "
        f"attempt {attempt} re-ran the step as run {new_run} (this run is no longer a step)"
    )
    changes: dict[str, Any] = {"validity": [*(run.validity or []), note]}
    if run.status in ACTIVE_RUN:
        stored = job_repo.stored_requests(session, old_run)
        changes |= {
            "status": RunStatus.PARTIAL if stored else RunStatus.FAILED,
            "finished_at": utcnow(),
        }
    repo.update_run(session, old_run, **changes)


def batch_run(session: Session, job: Job, batch: ResultBatch) -> str:
    """The run a sweep job's batch belongs to: one of its sweep's steps (422 otherwise)."""
    if not batch.run_id:
        raise Invalid("run_id: a sweep job's batch names its step's run", loc=("body", "run_id"))
    first = compare_repo.first_batch_no(session, job.id, job.attempt)
    if batch.batch_no < first:
        raise Invalid(
            f"batch_no: numbers below {first} belong to earlier attempts of this job; "
            f"attempt {job.attempt} numbers its batches from {first} (resume.first_batch_no)",
            loc=("body", "batch_no"),
        )
    step = compare_repo.step_of_run(session, batch.run_id)
    if step is None or step.sweep_id != _sweep_id(job):
        raise Invalid(
            f"run_id: {batch.run_id!r} is not a step of this job's sweep", loc=("body", "run_id")
        )
    return batch.run_id


@dataclass(frozen=True, slots=True)
class _StepRow:
    step_idx: int
    run_id: str
    load: float
    load_kind: LoadKind
    role: str


def _summary(
    sessions: sessionmaker[Session],
    step: _StepRow,
    report: dict[str, Any],
    find_max: FindMax | None = None,
) -> Any:
    with session_scope(sessions) as s:
        trace = repo.load_trace(s, step.run_id)
    load = math.inf if step.load < 0 else step.load
    summ = sweep_plan.step_summary(
        step.step_idx, load, step.load_kind, report, trace, step.run_id, find_max
    )
    return json_safe(sweep_plan.step_dict(summ, step.role))


def complete_step(
    session: Session,
    sessions: sessionmaker[Session],
    job_id: str,
    step_idx: int,
    req: StepComplete,
    principal: Principal,
) -> StepCompleted:
    """Finalize one step's run (every batch sent so far must have arrived) and answer its
    summary, from which the worker decides whether the sweep goes on. A step that ran to its
    end (not cancelled) is recorded as completed with that summary: a resumed attempt
    replays it."""
    from app.services.runs import run_report

    job = _sweep_job(session, job_id, req.lease_id, principal)
    found = _step(session, _sweep_id(job), step_idx)
    if found is None:
        raise NotFound(f"job {job_id!r} has no step {step_idx}")
    if found.summary is not None:  # a retry of a completed step: answer the same
        run = repo.find_run(session, found.run_id)
        status = run.status.value if run is not None else "succeeded"
        return StepCompleted(
            run_id=found.run_id, step_idx=step_idx, status=status, summary=dict(found.summary)
        )
    step_id = found.id
    step = _StepRow(
        found.step_idx,
        found.run_id,
        found.load,
        "concurrency" if found.load_kind == "concurrency" else "rate",
        found.role,
    )
    run = repo.find_run(session, step.run_id)
    if run is None:
        raise NotFound(f"the run of step {step_idx} was deleted")
    if run.status not in ACTIVE_RUN:  # a retry (the first try failed mid-way): the same
        status = run.status.value
        session.commit()
        report = run_report(sessions, step.run_id)
        summary = _summary(sessions, step, report, _find_max(job))
        _record_completed(sessions, step_id, req, summary)
        return StepCompleted(run_id=step.run_id, step_idx=step_idx, status=status, summary=summary)
    missing = missing_batches(session, job, req.total_batches)
    if missing:
        raise Conflict(
            f"batches missing: {missing} (of total_batches={req.total_batches}); "
            "upload them, then complete the step again"
        )
    outcome = decide(
        session,
        job,
        step.run_id,
        req.status,
        req.error,
        req.run_meta,
        bench_spec=dict(job.spec.get("bench") or {}),
        records=req.records,
    )
    hardware.stamp_run(session, step.run_id, job.worker_id, req.run_meta)
    if req.run_meta is not None:
        meta = req.run_meta
        changes = {"client_host": meta.client_host, "client_version": meta.client_version}
        repo.update_run(session, step.run_id, **{k: v for k, v in changes.items() if v})
    if req.server_metrics:
        from app.services.server_metrics import store_wire

        store_wire(session, step.run_id, req.server_metrics)
    session.commit()
    report = finalize_run(
        sessions,
        step.run_id,
        status=outcome.run_status,
        meta=req.run_meta,
        extra_notes=outcome.notes or None,
        lost_requests=outcome.lost,
    )
    summary = _summary(sessions, step, report, _find_max(job))
    _record_completed(sessions, step_id, req, summary)
    return StepCompleted(
        run_id=step.run_id, step_idx=step_idx, status=outcome.run_status.value, summary=summary
    )


def _record_completed(
    sessions: sessionmaker[Session], step_id: int, req: StepComplete, summary: dict[str, Any]
) -> None:
    """Store the summary answered for a step that ran to its end; a cancelled (stopped)
    step is not completed: a resumed attempt runs it again."""
    if req.status == "cancelled":
        return
    with session_scope(sessions) as s:
        compare_repo.set_step_summary(s, step_id, summary)


# ----------------------------------------------------------------------------- the end


def _unfinished_runs(
    session: Session, sweep_id: str, *, cancelled: bool = False
) -> list[tuple[str, RunStatus]]:
    """Step runs still running, with the status they end in: ``cancelled`` when the sweep
    was, else partial if any request was stored, else failed."""
    out: list[tuple[str, RunStatus]] = []
    for st in compare_repo.sweep_steps(session, sweep_id):
        run = repo.find_run(session, st.run_id)
        if run is not None and run.status in ACTIVE_RUN:
            stored = job_repo.stored_requests(session, st.run_id)
            status = RunStatus.PARTIAL if stored else RunStatus.FAILED
            out.append((st.run_id, RunStatus.CANCELLED if cancelled else status))
    return out


def _finalize_all(
    sessions: sessionmaker[Session], runs: list[tuple[str, RunStatus]], note: str
) -> None:
    for run_id, status in runs:
        finalize_run(sessions, run_id, status=status, meta=None, extra_notes=[note])


def complete_sweep(
    session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
) -> CompleteResponse:
    """End a sweep job (its batches all arrived): the job's state, the sweep's status and
    stop reason; a step left unfinished (the worker failed mid-step) is finalized."""
    sweep_id = _sweep_id(job)
    n_steps = step_count(session, job)
    state: JobState
    reason: str | None
    if job.cancel_requested or req.status == "cancelled":
        state, sweep_status = "cancelled", "cancelled"
        reason = req.stop_reason or req.error or f"cancelled after {n_steps} step(s)"
    elif req.status == "failed":
        state, sweep_status = "failed", "partial" if n_steps else "failed"
        reason = req.stop_reason or f"failed on the worker: {req.error or 'unknown error'}"
    else:
        state, sweep_status, reason = "succeeded", "succeeded", req.stop_reason
    now = utcnow()
    end_leased_job(session, job, req.lease_id, state, req.error if state == "failed" else None, now)
    compare_repo.update_sweep(
        session, sweep_id, status=sweep_status, stop_reason=reason, finished_at=now
    )
    leftover = _unfinished_runs(session, sweep_id, cancelled=state == "cancelled")
    session.commit()
    _finalize_all(sessions, leftover, f"the sweep ended ({state}) before this step completed")
    return CompleteResponse(job_id=job.id, state=state, run_id=None)


def expired(session: Session, job: Job, outcome: str) -> list[tuple[str, Outcome]]:
    """After a sweep job's lease was lost (``app.services.jobs.expire_lost_leases``): mark the
    sweep, and return its unfinished step runs with the outcome to finalize them with.
    Requeued (attempts left): the sweep is queued again, its steps kept; the interrupted
    step's run is finalized now and replaced when the next attempt re-runs the step."""
    sweep_id = _sweep_id(job)
    runs = _unfinished_runs(session, sweep_id)
    if outcome == "requeued":
        compare_repo.update_sweep(session, sweep_id, status="queued")
        note = (
            f"worker lost during this step (lease expired on attempt {job.attempt}); the "
            f"sweep was requeued to resume: attempt {job.attempt + 1} re-runs this step"
        )
        return [_lost_step(session, job, rid, st, note) for rid, st in runs]
    n_steps = step_count(session, job)
    now = utcnow()
    if outcome == "partial":
        reason = f"worker lost after {n_steps} step(s) (lease expired): finished steps are kept"
        compare_repo.update_sweep(
            session, sweep_id, status="partial", stop_reason=reason, finished_at=now
        )
    else:
        status = "cancelled" if outcome == "cancelled" else "failed"
        reason = "cancelled; worker lost" if status == "cancelled" else "worker lost"
        compare_repo.update_sweep(
            session, sweep_id, status=status, stop_reason=reason, finished_at=now
        )
    note = "worker lost during this step (lease expired)"
    return [_lost_step(session, job, rid, st, note) for rid, st in runs]


def _lost_step(
    session: Session, job: Job, run_id: str, status: RunStatus, note: str
) -> tuple[str, Outcome]:
    """An unfinished step run's outcome after its worker was lost: the requests the worker's
    last heartbeat said this step had sent, beyond those stored, are lost."""
    progress = job.progress if isinstance(job.progress, dict) else {}
    lost = worker_lost_count(session, run_id, progress) if progress.get("run_id") == run_id else 0
    notes = [note]
    if lost:
        notes.append(f"{lost} requests the worker had sent were not stored")
    return run_id, Outcome("failed", status, "worker lost", notes, lost)


def cancel_sweep(session: Session, sweep_id: str) -> dict[str, Any]:
    """Queued: cancelled now. On a worker: flagged; it stops at its next heartbeat, keeping
    the steps already finished. Finished (or run locally): 409."""
    sweep = compare_repo.find_sweep(session, sweep_id)
    if sweep is None:
        raise NotFound(f"no sweep with id {sweep_id!r}")
    if sweep.plan:  # steps dealt over workers: the server sequences them
        return sharded_sweeps.cancel(session, sweep)
    job = job_repo.get_job(session, sweep.job_id) if sweep.job_id else None
    if job is None:
        raise Conflict(f"sweep {sweep_id!r} has no job (it ran locally): nothing to cancel")
    now = utcnow()
    if job.state == "queued" and job_repo.transition(
        session,
        job.id,
        from_states=("queued",),
        state="cancelled",
        finished_at=now,
        spec=public_spec(job.spec),
    ):
        n_steps = step_count(session, job)
        reason = (
            f"cancelled while queued to resume after {n_steps} step(s)"
            if n_steps
            else "cancelled before it started"
        )
        compare_repo.update_sweep(
            session, sweep_id, status="cancelled", stop_reason=reason, finished_at=now
        )
        return {"sweep_id": sweep_id, "job_id": job.id, "state": "cancelled",
                "cancel_requested": False}  # fmt: skip
    if job.state in ACTIVE_STATES and job_repo.transition(
        session, job.id, from_states=ACTIVE_STATES, cancel_requested=True
    ):
        return {"sweep_id": sweep_id, "job_id": job.id, "state": job.state,
                "cancel_requested": True}  # fmt: skip
    raise Conflict(f"sweep {sweep_id!r} cannot be cancelled: its job is {job.state}")


# ----------------------------------------------------------------------- the contract


class SweepKind:
    """``JobKindRules`` of a sweep job: its batches go to its step runs, numbered on from
    earlier attempts; a lost lease requeues it to resume while attempts remain."""

    name: JobKind = "sweep"

    def bench_spec(self, job: Job) -> dict[str, Any]:
        return dict((job.spec or {}).get("bench") or {})  # every step plans the base spec's

    def lease_resume(self, session: Session, job: Job) -> SweepResume | None:
        return resume_of(session, job)

    def batch_run(self, session: Session, job: Job, batch: ResultBatch) -> str | None:
        return batch_run(session, job, batch)

    def missing_batches(self, session: Session, job: Job, total_batches: int) -> list[int]:
        return missing_batches(session, job, total_batches)

    def recomplete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> None:
        return None  # a sweep's completion has nothing left half-done: its steps finalized

    def complete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> CompleteResponse:
        return complete_sweep(session, sessions, job, req)

    def kept_uploads(self, session: Session, job: Job) -> int:
        return job_repo.count_batches(session, job.id) or step_count(session, job)

    def resumes_after_loss(self, job: Job) -> bool:
        return True

    def loss(self, session: Session, job: Job) -> Arrival:
        return Arrival([], 0)  # a sweep's runs: ``after_loss`` finalizes each with its own

    def after_loss(self, session: Session, job: Job, outcome: str) -> list[tuple[str, Outcome]]:
        return expired(session, job, outcome)


SWEEP = SweepKind()
