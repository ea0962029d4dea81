"""SQL of a running job's live /metrics history (``job_live_series``). Callers own the
session and its commit; the payload is ``app.services.live_series``'s."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.storage.jsonsafe import json_safe
from app.storage.models import utcnow
from app.storage.models_series import JobLiveSeries


def get(session: Session, job_id: str) -> dict[str, Any] | None:
    row = session.scalars(select(JobLiveSeries).where(JobLiveSeries.job_id == job_id)).first()
    return dict(row.payload) if row is not None else None


def put(session: Session, job_id: str, payload: dict[str, Any]) -> None:
    row = session.get(JobLiveSeries, job_id)
    if row is None:
        session.add(JobLiveSeries(job_id=job_id, updated_at=utcnow(), payload=json_safe(payload)))
    else:
        row.payload = json_safe(payload)
        row.updated_at = utcnow()
    session.flush()
