"""SQL for sweeps, sweep steps and baselines. Callers own the session and its commit."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.storage.jsonsafe import json_safe
from app.storage.models import Job, JobBatch, utcnow
from app.storage.models_compare import Baseline, Sweep, SweepStep
from app.storage.repository import _normalize_tags  # the one rule for run and sweep tags


class PinnedError(Exception):
    """The baseline is pinned: it is not replaced until unpinned."""


def new_sweep_id() -> str:
    return "sw" + secrets.token_hex(6)


# ---------------------------------------------------------------------------- sweeps


def create_sweep(
    session: Session,
    *,
    spec: dict[str, Any],
    mode: str,
    loads: list[float],
    name: str | None = None,
    status: str = "running",
    job_id: str | None = None,
    find_max: dict[str, Any] | None = None,
) -> str:
    sweep = Sweep(
        id=new_sweep_id(),
        name=name,
        mode=mode,
        spec=json_safe(spec),
        loads=[float(x) for x in loads],
        status=status,
        job_id=job_id,
        created_at=utcnow(),
        find_max=find_max,
    )
    session.add(sweep)
    session.flush()
    return sweep.id


def find_sweep(session: Session, sweep_id: str) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def list_sweeps(session: Session, *, limit: int = 100) -> list[Sweep]:
    stmt = select(Sweep).order_by(Sweep.created_at.desc(), Sweep.id).limit(limit)
    return list(session.scalars(stmt))


def sequenced_sweeps(session: Session, statuses: tuple[str, ...]) -> list[str]:
    """Sweeps the server sequences (``sweeps.plan`` set: steps dealt over workers) in one
    of ``statuses``."""
    stmt = select(Sweep.id).where(Sweep.plan.is_not(None), Sweep.status.in_(statuses))
    return list(session.scalars(stmt))


def update_sweep(session: Session, sweep_id: str, **changes: Any) -> None:
    allowed = {"status", "stop_reason", "finished_at", "loads", "job_id", "name"}
    bad = set(changes) - allowed
    if bad:
        raise ValueError(f"cannot update sweep fields {sorted(bad)}")
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(**changes))


def set_sweep_tags(session: Session, sweep_id: str, tags: list[str]) -> list[str]:
    """Replace a sweep's tags (trimmed, de-duplicated, order kept, as a run's); returns
    them. ValueError/TypeError naming a bad tag; KeyError when there is no such sweep."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise KeyError(sweep_id)
    sweep.tags = _normalize_tags(tags)
    session.flush()
    return list(sweep.tags)


def set_sweep_note(session: Session, sweep_id: str, note: str | None) -> None:
    """Replace a sweep's free-text note (``None`` clears it); KeyError when there is none."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise KeyError(sweep_id)
    sweep.note = note
    session.flush()


def delete_sweep(session: Session, sweep_id: str) -> bool:
    """Delete a sweep row and its job (the job's batches and telemetry go by cascade; its
    steps' runs are the caller's to delete first). False when there was no such sweep."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return False
    job = session.get(Job, sweep.job_id) if sweep.job_id else None
    if job is not None:
        session.delete(job)
    session.delete(sweep)
    session.flush()
    return True


def add_step(
    session: Session,
    sweep_id: str,
    *,
    step_idx: int,
    run_id: str,
    load: float,
    load_kind: str,
    role: str = "step",
    attempt: int = 1,
) -> None:
    session.add(
        SweepStep(
            sweep_id=sweep_id,
            step_idx=step_idx,
            run_id=run_id,
            load=float(load),
            load_kind=load_kind,
            role=role,
            attempt=attempt,
        )
    )
    session.flush()


def repoint_step(
    session: Session,
    step_id: int,
    *,
    run_id: str,
    load: float,
    load_kind: str,
    role: str,
    attempt: int,
) -> None:
    """Point a step at a new run (a resumed sweep job re-runs its interrupted step there)."""
    values = {
        "run_id": run_id,
        "load": float(load),
        "load_kind": load_kind,
        "role": role,
        "attempt": attempt,
        "summary": None,
    }
    session.execute(update(SweepStep).where(SweepStep.id == step_id).values(**values))
    session.flush()


def set_step_summary(session: Session, step_id: int, summary: dict[str, Any]) -> None:
    """Record that a step completed, with the summary its worker was answered."""
    stmt = update(SweepStep).where(SweepStep.id == step_id).values(summary=json_safe(summary))
    session.execute(stmt)


def first_batch_no(session: Session, job_id: str, attempt: int) -> int:
    """The first batch number attempt ``attempt`` of a job uses: one past the highest any
    earlier attempt uploaded (0 when none did). Batch numbers stay unique per job, so a
    resumed sweep job numbers its batches after the ones it keeps."""
    stmt = select(func.max(JobBatch.batch_no)).where(
        JobBatch.job_id == job_id, JobBatch.attempt < attempt
    )
    top = session.scalar(stmt)
    return 0 if top is None else int(top) + 1


def sweep_steps(session: Session, sweep_id: str) -> list[SweepStep]:
    stmt = select(SweepStep).where(SweepStep.sweep_id == sweep_id).order_by(SweepStep.step_idx)
    return list(session.scalars(stmt))


def step_of_run(session: Session, run_id: str) -> SweepStep | None:
    return session.scalar(select(SweepStep).where(SweepStep.run_id == run_id))


def step_counts(session: Session, sweep_ids: list[str]) -> dict[str, int]:
    """The number of step rows (probe steps included) of each sweep; absent means none."""
    if not sweep_ids:
        return {}
    stmt = (
        select(SweepStep.sweep_id, func.count())
        .where(SweepStep.sweep_id.in_(sweep_ids))
        .group_by(SweepStep.sweep_id)
    )
    return {sid: int(n) for sid, n in session.execute(stmt)}


def sweep_ids_of_runs(session: Session, run_ids: list[str]) -> dict[str, str]:
    if not run_ids:
        return {}
    rows = session.execute(
        select(SweepStep.run_id, SweepStep.sweep_id).where(SweepStep.run_id.in_(run_ids))
    )
    return {r: s for r, s in rows}


# ------------------------------------------------------------------------- baselines


def current_baseline(session: Session, name: str) -> Baseline | None:
    stmt = (
        select(Baseline)
        .where(Baseline.name == name, Baseline.replaced_at.is_(None))
        .order_by(Baseline.version.desc())
        .limit(1)
    )
    return session.scalar(stmt)


def baseline_history(session: Session, name: str) -> list[Baseline]:
    stmt = select(Baseline).where(Baseline.name == name).order_by(Baseline.version.desc())
    return list(session.scalars(stmt))


def list_baselines(session: Session) -> list[Baseline]:
    """The current version of every baseline name, by name."""
    stmt = select(Baseline).where(Baseline.replaced_at.is_(None)).order_by(Baseline.name)
    return list(session.scalars(stmt))


def save_baseline(
    session: Session,
    name: str,
    *,
    run_id: str | None = None,
    sweep_id: str | None = None,
    pinned: bool = False,
    note: str | None = None,
    now: dt.datetime | None = None,
) -> Baseline:
    """Add a version of ``name`` pointing at a run or a sweep; the previous version is marked
    replaced (kept in the history). Raises PinnedError when the current version is pinned."""
    if (run_id is None) == (sweep_id is None):
        raise ValueError("a baseline points at exactly one run or one sweep")
    when = now or utcnow()
    cur = current_baseline(session, name)
    if cur is not None and cur.pinned:
        raise PinnedError(
            f"baseline {name!r} (version {cur.version}) is pinned: unpin it before replacing it"
        )
    top = session.scalar(select(func.max(Baseline.version)).where(Baseline.name == name))
    if cur is not None:
        cur.replaced_at = when
    row = Baseline(
        name=name,
        version=int(top or 0) + 1,
        run_id=run_id,
        sweep_id=sweep_id,
        pinned=pinned,
        note=note,
        created_at=when,
    )
    session.add(row)
    session.flush()
    return row


def set_pinned(session: Session, name: str, pinned: bool) -> Baseline | None:
    cur = current_baseline(session, name)
    if cur is not None:
        cur.pinned = pinned
        session.flush()
    return cur
