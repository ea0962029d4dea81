"""SQL for API tokens. Only the SHA-256 hex digest of a secret is ever stored."""

from __future__ import annotations

import datetime as dt
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.storage.models import ApiToken, utcnow


def insert_token(
    session: Session, *, name: str | None, scopes: list[str], digest: str, prefix: str
) -> ApiToken:
    row = ApiToken(
        id=secrets.token_hex(6),
        name=name,
        scopes=list(scopes),
        hash=digest,
        prefix=prefix,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def find_by_hash(session: Session, digest: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(ApiToken.hash == digest)).first()


def get_token(session: Session, token_id: str) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[ApiToken]:
    stmt = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    if not include_revoked:
        stmt = stmt.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(stmt))


def revoke(session: Session, token_id: str, when: dt.datetime | None = None) -> ApiToken | None:
    row = session.get(ApiToken, token_id)
    if row is None:
        return None
    if row.revoked_at is None:
        row.revoked_at = when or utcnow()
        session.flush()
    return row


def touch(session: Session, token_id: str, when: dt.datetime) -> None:
    row = session.get(ApiToken, token_id)
    if row is not None:
        row.last_used_at = when
        session.flush()
