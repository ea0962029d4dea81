"""Read-only SQL for the browser dashboard (app.web): small column reads, no event blobs
except for one request at a time."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.storage.browse import SUMMARY_COLUMNS
from app.storage.models import Job, Request

I64 = npt.NDArray[np.int64]


def schedule_columns(session: Session, run_id: str) -> tuple[I64, I64]:
    """(scheduled_ns, turn) of the run's measured requests, ordered by index like
    ``load_trace``; turn is -1 for a single request (not a session's turn)."""
    t = Request.__table__
    stmt = (
        select(t.c.scheduled_ns, t.c.turn_idx)
        .where(t.c.run_id == run_id, t.c.warmup.is_(False))
        .order_by(t.c.idx)
    )
    rows = session.execute(stmt).all()
    sched = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    turn = np.fromiter((-1 if r[1] is None else r[1] for r in rows), np.int64, len(rows))
    return sched, turn


def measured_indexes(session: Session, run_id: str) -> I64:
    """Request indexes of the measured (non-warm-up) requests, in ``load_trace`` order."""
    t = Request.__table__
    stmt = select(t.c.idx).where(t.c.run_id == run_id, t.c.warmup.is_(False)).order_by(t.c.idx)
    values = list(session.scalars(stmt))
    return np.asarray(values, np.int64) if values else np.zeros(0, np.int64)


def request_row(session: Session, run_id: str, idx: int) -> dict[str, Any] | None:
    """The summary columns of one request (``browse.SUMMARY_COLUMNS``), or None."""
    t = Request.__table__
    stmt = select(*(t.c[c] for c in SUMMARY_COLUMNS)).where(t.c.run_id == run_id, t.c.idx == idx)
    row = session.execute(stmt).first()
    return None if row is None else dict(row._mapping)


def active_jobs_by_run(session: Session, run_ids: list[str]) -> dict[str, Job]:
    """The newest job of each of these runs that is not finished yet, keyed by run id."""
    if not run_ids:
        return {}
    stmt = (
        select(Job)
        .where(Job.run_id.in_(run_ids), Job.state.in_(("queued", "leased", "running")))
        .order_by(Job.created_at)
    )
    out: dict[str, Job] = {}
    for job in session.scalars(stmt):
        if job.run_id is not None:
            out[job.run_id] = job
    return out
