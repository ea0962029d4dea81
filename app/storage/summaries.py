"""SQL of the stored run-page summaries (``run_page_summaries``, migration 0011).

The rows are opaque here: ``app.services.run_summaries`` encodes and decodes them."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.storage.models import RunPageSummary, utcnow


@dataclass(frozen=True, slots=True)
class StoredSummary:
    version: int
    n_requests: int
    payload: bytes
    columns: bytes


def get_summary(session: Session, run_id: str) -> StoredSummary | None:
    """The run's stored page summary, or None when it has none."""
    t = RunPageSummary.__table__
    row = session.execute(
        select(t.c.version, t.c.n_requests, t.c.payload, t.c.columns).where(t.c.run_id == run_id)
    ).first()
    if row is None:
        return None
    return StoredSummary(int(row[0]), int(row[1]), bytes(row[2]), bytes(row[3]))


def put_summary(
    session: Session,
    run_id: str,
    *,
    version: int,
    n_requests: int,
    payload: bytes,
    columns: bytes,
) -> None:
    """Store (or replace) the run's page summary."""
    session.execute(delete(RunPageSummary).where(RunPageSummary.run_id == run_id))
    session.add(
        RunPageSummary(
            run_id=run_id,
            version=version,
            n_requests=n_requests,
            created_at=utcnow(),
            payload=payload,
            columns=columns,
        )
    )
    session.flush()


def delete_summary(session: Session, run_id: str) -> bool:
    """Forget the run's page summary (it is recomputed on the next view)."""
    res = session.execute(delete(RunPageSummary).where(RunPageSummary.run_id == run_id))
    return bool(getattr(res, "rowcount", 0))
