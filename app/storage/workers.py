"""SQL for registered workers."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.storage.models import Worker, utcnow


def insert_worker(
    session: Session,
    *,
    name: str | None,
    hostname: str,
    capabilities: dict[str, Any],
    labels: dict[str, str],
    token_id: str | None,
) -> Worker:
    now = utcnow()
    row = Worker(
        id=secrets.token_hex(8),
        name=name,
        hostname=hostname,
        capabilities=capabilities,
        labels=dict(labels),
        registered_at=now,
        last_seen_at=now,
        token_id=token_id,
    )
    session.add(row)
    session.flush()
    return row


def get_worker(session: Session, worker_id: str) -> Worker | None:
    return session.get(Worker, worker_id)


def list_workers(session: Session, *, limit: int, offset: int) -> list[Worker]:
    stmt = (
        select(Worker).order_by(Worker.last_seen_at.desc(), Worker.id).limit(limit).offset(offset)
    )
    return list(session.scalars(stmt))


def count_workers(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Worker)) or 0)


def seen(session: Session, worker_id: str, when: dt.datetime, **changes: Any) -> None:
    row = session.get(Worker, worker_id)
    if row is None:
        return
    row.last_seen_at = when
    for k, v in changes.items():
        setattr(row, k, v)
    session.flush()


def seen_job_done(session: Session, worker_id: str, job_id: str) -> None:
    """Clear the worker's current job if it is still ``job_id``."""
    row = session.get(Worker, worker_id)
    if row is not None and row.current_job_id == job_id:
        row.current_job_id = None
        session.flush()
