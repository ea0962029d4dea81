"""Dashboard sign-in sessions and their CSRF tokens.

Signing in with an API token opens a session: the browser's cookie holds a random session
secret (its SHA-256 is stored), never the token itself; the session expires after
``SESSION_TTL`` and is revoked on sign-out; revoking its token ends it too. Each session
has a CSRF token that every state-changing form carries (``app.web.context.csrf_ok``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.services.auth import Principal, effective_scopes
from app.storage import tokens as token_repo
from app.storage import web_sessions as session_repo
from app.storage.models import utcnow

SESSION_TTL = dt.timedelta(hours=12)
MAX_SECRET = 200


@dataclass(frozen=True, slots=True)
class SignedIn:
    principal: Principal
    csrf: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def open_session(session: Session, principal: Principal) -> tuple[str, str]:
    """A new session for ``principal``: (cookie secret, CSRF token)."""
    secret = "tts_" + secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    session_repo.create(
        session,
        digest=_digest(secret),
        token_id=principal.token_id,
        csrf=csrf,
        now=utcnow(),
        ttl=SESSION_TTL,
    )
    return secret, csrf


def signed_in(session: Session, secret: str) -> SignedIn | None:
    """The principal and CSRF token of a live session whose token is still valid."""
    if not secret or len(secret) > MAX_SECRET:
        return None
    row = session_repo.active(session, _digest(secret), utcnow())
    if row is None:
        return None
    token = token_repo.get_token(session, row.token_id)
    if token is None or token.revoked_at is not None:
        return None
    principal = Principal(
        token_id=token.id,
        name=token.name,
        scopes=tuple(token.scopes),
        effective=effective_scopes(list(token.scopes)),
    )
    return SignedIn(principal, row.csrf)


def close_session(session: Session, secret: str) -> None:
    if secret and len(secret) <= MAX_SECRET:
        session_repo.revoke(session, _digest(secret), utcnow())


def same_token(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())
