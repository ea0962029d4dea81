"""SQL for dashboard sign-in sessions (``web_sessions``)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.storage.models import WebSession


def create(
    session: Session, *, digest: str, token_id: str, csrf: str, now: dt.datetime, ttl: dt.timedelta
) -> None:
    session.add(
        WebSession(id=digest, token_id=token_id, csrf=csrf, created_at=now, expires_at=now + ttl)
    )
    session.flush()


def active(session: Session, digest: str, now: dt.datetime) -> WebSession | None:
    """The session with this digest, unless it expired or was revoked."""
    row = session.scalar(select(WebSession).where(WebSession.id == digest))
    if row is None or row.revoked_at is not None or row.expires_at <= now:
        return None
    return row


def revoke(session: Session, digest: str, now: dt.datetime) -> bool:
    res = session.execute(
        update(WebSession)
        .where(WebSession.id == digest, WebSession.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return bool(getattr(res, "rowcount", 0))
