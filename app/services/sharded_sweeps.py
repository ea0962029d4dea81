"""A sweep whose steps are each dealt over workers (``shards`` K > 1, docs/scale.md): the
server sequences the steps. Each step is one run dealt over K workers exactly as a sharded
bench run is (``shard_jobs``: K bench leases, one common start, warm-ups gated, one merged
run with its "By shard" rows), so no worker holds a lease between steps or while another
works.

* **Creating** it stores the plan, the requirements and the bench spec (its API key
  sealed) on the sweep (``sweeps.plan``) and queues step 0's run and its K jobs.
* **A step's run ended** (``after_run``, called wherever a dealt run is finalized, and
  ``advance_stalled`` from the lease sweeper, which catches up on anything missed): its
  summary is computed from the merged run, stored, and the plan's rules decide what
  comes next (``sweep_plan.next_step``: ``drive`` replayed over the stored summaries,
  so a find-max search decides from each merged step run, once, the same everywhere).
  The next step's run is queued, or the sweep ends with the plan's reason.
* **A lost shard** leaves its step's run partial (its notes name the shard and its lost
  requests); the step's summary is the merged run's and the sweep goes on. A step whose
  shards were not all leased in time (its run failed) ends the sweep: partial after
  earlier steps, else failed, the stop reason naming the step. Nothing is left to resume
  after a killed worker: the next step goes to whichever workers are free.
* **Cancel** stops the current step's shards (``cancel_shards``); once its run ended the
  sweep ends cancelled, the steps finished before it kept.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.client import sweep_plan
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.wire import JobRequirements
from app.services.errors import Conflict, Invalid
from app.services.job_rules import ACTIVE_RUN
from app.services.runs import run_report
from app.services.secretbox import SEALED, SecretBox
from app.services.shard_jobs import cancel_shards, create_shard_jobs
from app.services.shard_jobs import expire_waits as expire_shard_waits
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jobs import TERMINAL_STATES
from app.storage.jsonsafe import json_safe
from app.storage.models import utcnow
from app.storage.models_compare import Sweep

log = logging.getLogger(__name__)
ACTIVE_SWEEP = ("queued", "running")


def create(
    session: Session,
    spec: RunSpec,
    plan: sweep_plan.SweepPlan,
    *,
    requirements: JobRequirements,
    name: str | None,
    max_attempts: int,
    box: SecretBox,
) -> tuple[str, str]:
    """The sweep (queued) and its first step's run and K jobs: (sweep_id, shard 0's job).
    A step at a concurrency below the shards cannot be dealt: refused (422 naming shards)."""
    check(spec.shards, plan)
    sweep_id = compare_repo.create_sweep(
        session,
        spec=spec.model_dump(mode="json"),
        mode=plan.mode,
        loads=list(plan.loads),
        name=name,
        status="queued",
        find_max=None if plan.find_max is None else plan.find_max.to_dict(),
    )
    bench: dict[str, Any] = json_safe(spec.model_dump(mode="json"))
    if spec.api_key:
        bench["api_key"] = spec.api_key
    state = {
        "plan": sweep_plan.plan_dict(plan),
        "requirements": requirements.model_dump(mode="json"),
        "max_attempts": max_attempts,
        "name": name or f"sweep {sweep_id}",
        "bench": box.seal_spec(bench),
        "cancel_requested": False,
    }
    session.get(Sweep, sweep_id).plan = state  # type: ignore[union-attr]
    try:
        first = _start_step(session, sweep_id, state, 0, sweep_plan.next_step(plan, []))
    except ValueError as e:  # the first step's spec is refused (the caller rolls back)
        why = f"shards: the first step cannot be dealt: {e}"
        raise Invalid(why, loc=("body", "shards")) from None
    return sweep_id, first


def check(shards: int, plan: sweep_plan.SweepPlan) -> None:
    """Every step of the plan can be dealt over ``shards`` workers (else ``Invalid``):
    each needs a concurrency of at least ``shards`` (rates: the spec's own cap, checked
    with the spec)."""
    low: float | None = None
    if plan.find_max is not None:
        low = plan.find_max.start if plan.find_max.kind == "concurrency" else None
    elif plan.mode == "auto":
        low = 1.0  # its first probe is one request at a time
    elif plan.load_kind == "concurrency":
        low = min(plan.loads)
    if low is not None and low < shards:
        what = "an auto sweep's first probe" if plan.mode == "auto" else "its lowest step"
        raise Invalid(
            f"shards: each step is dealt over {shards} workers, but {what} runs at "
            f"concurrency {low:g}: every concurrency must be at least the shards",
            loc=("body", "shards"),
        )


def _start_step(
    session: Session, sweep_id: str, state: dict[str, Any], idx: int, nxt: sweep_plan.NextStep
) -> str:
    """Queue step ``idx``'s run, dealt over the spec's shards; returns shard 0's job."""
    assert nxt.load is not None
    sealed = dict(state["bench"])
    data = {k: v for k, v in sealed.items() if k != SEALED}
    if data.get("request_rate") is None:  # JSON has no infinity: unlimited is null
        data.pop("request_rate", None)
    spec = sweep_plan.step_spec(RunSpec.model_validate(data), nxt.load, nxt.kind)
    job_spec: dict[str, Any] = json_safe(spec.model_dump(mode="json"))
    if SEALED in sealed:  # the key stays sealed, as the sweep holds it
        job_spec[SEALED] = sealed[SEALED]
    label = sweep_plan.step_label(nxt.load, nxt.kind)
    run_id = repo.create_run(
        session, spec, source="bench", name=f"{state['name']} · {label}", status=RunStatus.QUEUED
    )
    first = create_shard_jobs(
        session,
        spec,
        job_spec,
        requirements=dict(state["requirements"]),
        run_id=run_id,
        max_attempts=int(state["max_attempts"]),
    )
    compare_repo.add_step(
        session,
        sweep_id,
        step_idx=idx,
        run_id=run_id,
        load=-1.0 if math.isinf(nxt.load) else float(nxt.load),
        load_kind=nxt.kind,
        role="probe" if nxt.role == "probe" else "step",
    )
    changes: dict[str, Any] = {"job_id": first}
    if idx:
        changes["status"] = "running"
    if nxt.loads is not None:
        changes["loads"] = [float(x) for x in nxt.loads]
    compare_repo.update_sweep(session, sweep_id, **changes)
    return first


def _end(session: Session, sweep_id: str, status: str, reason: str | None) -> None:
    compare_repo.update_sweep(
        session, sweep_id, status=status, stop_reason=reason, finished_at=utcnow()
    )


def after_run(sessions: sessionmaker[Session], run_id: str) -> None:
    """A run ended: when it is a step of a sweep the server sequences, go on (``advance``)."""
    with session_scope(sessions) as s:
        step = compare_repo.step_of_run(s, run_id)
        sweep = compare_repo.find_sweep(s, step.sweep_id) if step is not None else None
        if sweep is None or not sweep.plan:
            return
        sweep_id = sweep.id
    advance(sessions, sweep_id)


def expire_waits(sessions: sessionmaker[Session], wait_s: float) -> list[str]:
    """``shard_jobs.expire_waits``, then each failed run's sweep, if any, goes on (ends)."""
    failed = expire_shard_waits(sessions, wait_s)
    for run_id in failed:
        after_run(sessions, run_id)
    return failed


def advance_stalled(sessions: sessionmaker[Session]) -> None:
    """Every active sweep the server sequences whose latest step's run has ended but was
    not followed up (a server restart between the two, a failed finalization): go on."""
    with session_scope(sessions) as s:
        ids = compare_repo.sequenced_sweeps(s, ACTIVE_SWEEP)
    for sweep_id in ids:
        try:
            advance(sessions, sweep_id)
        except Exception:
            log.exception("sweep %s: going on after its step failed", sweep_id)


def advance(sessions: sessionmaker[Session], sweep_id: str) -> None:
    """Once the latest step's run ended: store its summary, then queue the next step, or
    end the sweep (the module doc's rules). Nothing while the step runs."""
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        if sweep is None or not sweep.plan or sweep.status not in ACTIVE_SWEEP:
            return
        state = dict(sweep.plan)
        steps = compare_repo.sweep_steps(s, sweep_id)
        if not steps:
            return
        last = steps[-1]
        run = repo.find_run(s, last.run_id)
        if run is None or run.status in ACTIVE_RUN:
            return
        status = RunStatus(run.status)
        done = sum(1 for st in steps if st.summary is not None)
        if state.get("cancel_requested") or status is RunStatus.CANCELLED:
            _end(s, sweep_id, "cancelled", f"cancelled after {done} step(s)")
            return
        if status is RunStatus.FAILED:
            why = next(iter(run.validity or []), "its run failed")
            _end(
                s, sweep_id, "partial" if done else "failed", f"step {last.step_idx} failed: {why}"
            )
            return
        step_id, need = last.id, last.summary is None
        row = (last.step_idx, last.run_id, last.load, last.load_kind, last.role)
        fm = sweep.find_max
    if need:
        summary = _summary(sessions, row, fm)
        with session_scope(sessions) as s:
            compare_repo.set_step_summary(s, step_id, summary)
    try:
        with session_scope(sessions) as s:
            steps = compare_repo.sweep_steps(s, sweep_id)
            done_steps = [sweep_plan.step_from_dict(dict(st.summary or {})) for st in steps]
            plan = sweep_plan.plan_of(dict(state["plan"]))
            nxt = sweep_plan.next_step(plan, done_steps)
            if nxt.load is None:
                if nxt.loads is not None:
                    compare_repo.update_sweep(s, sweep_id, loads=[float(x) for x in nxt.loads])
                _end(s, sweep_id, "succeeded", nxt.reason)
                return
            try:
                _start_step(s, sweep_id, state, len(steps), nxt)
            except ValueError as e:  # its spec is refused (a load the shards cannot deal)
                reason = f"step {len(steps)} could not be dealt over the workers: {e}"
                s.rollback()
                _end(s, sweep_id, "partial", reason)
    except IntegrityError:  # another call queued that step first
        log.info("sweep %s: its next step was queued by another call", sweep_id)


def _summary(
    sessions: sessionmaker[Session],
    row: tuple[int, str, float, str, str],
    find_max: dict[str, Any] | None,
) -> dict[str, Any]:
    """The step's summary from its merged run, as a worker's sweep is answered it."""
    from app.analysis.slo_search import find_max_of

    idx, run_id, load, kind, role = row
    report = run_report(sessions, run_id)
    with session_scope(sessions) as s:
        trace = repo.load_trace(s, run_id)
    fm = find_max_of(find_max) if isinstance(find_max, dict) else None
    lk: Any = "concurrency" if kind == "concurrency" else "rate"
    summ = sweep_plan.step_summary(
        idx, math.inf if load < 0 else load, lk, report, trace, run_id, fm
    )
    out: dict[str, Any] = json_safe(sweep_plan.step_dict(summ, role))
    return out


def cancel(session: Session, sweep: Sweep) -> dict[str, Any]:
    """Stop the current step's shards (queued ones now, leased ones at their next
    heartbeat); the sweep ends cancelled once that run ended (now, when none was leased)."""
    if sweep.status not in ACTIVE_SWEEP:
        raise Conflict(f"sweep {sweep.id!r} cannot be cancelled: it is {sweep.status}")
    sweep.plan = {**dict(sweep.plan or {}), "cancel_requested": True}
    steps = compare_repo.sweep_steps(session, sweep.id)
    jobs = job_repo.shard_jobs(session, steps[-1].run_id) if steps else []
    live = [j for j in jobs if j.state not in TERMINAL_STATES]
    state = cancel_shards(session, steps[-1].run_id, jobs) if live else "cancelled"
    if state == "cancelled":
        done = sum(1 for st in steps if st.summary is not None)
        reason = f"cancelled after {done} step(s)" if done else "cancelled before it started"
        _end(session, sweep.id, "cancelled", reason)
    return {"sweep_id": sweep.id, "job_id": jobs[0].id if jobs else (sweep.job_id or ""),
            "state": state, "cancel_requested": state != "cancelled"}  # fmt: skip
