"""Dependencies: the settings, one database session per request, and auth by scope."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from app.services import auth
from app.services.auth import Principal
from app.services.secretbox import SecretBox
from app.settings import Settings

MAX_OFFSET = 2**31 - 1  # pagination offsets and indexes: larger ones are 422, not overflow

bearer = HTTPBearer(auto_error=False, description="an API token: `tt_...`")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_sessions(request: Request) -> sessionmaker[Session]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    return sessions


def get_session(request: Request) -> Iterator[Session]:
    """One session per request: committed when the route returns, rolled back on error."""
    session = get_sessions(request)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def get_secretbox(request: Request) -> SecretBox:
    box: SecretBox = request.app.state.secretbox
    return box


SettingsDep = Annotated[Settings, Depends(get_settings)]
SecretBoxDep = Annotated[SecretBox, Depends(get_secretbox)]
SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


AUTHENTICATED = "tokentrace.authenticated"  # request state: (scope, principal), AuthFirst


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"}
    )


def too_many_failures(retry_after_s: int) -> HTTPException:
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        detail=f"too many failed token checks from this address: retry in {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


def check_token(
    sessions: sessionmaker[Session],
    secret: str | None,
    scope: str,
    limiter: auth.FailureLimiter,
    client: str | None,
) -> Principal:
    """The principal of the bearer token ``secret``, which must hold ``scope``: 401 when it
    is missing, invalid or revoked, 403 when it lacks the scope, 429 while ``client`` (its
    address) has failed too often (``HTTPException``)."""
    if not secret:
        raise _unauthorized(
            f"missing token: send 'Authorization: Bearer <token>' with the {scope!r} scope"
        )
    wait = limiter.retry_after(client)
    if wait is not None:  # not even checked: a guess here tells nothing
        raise too_many_failures(wait)
    with sessions() as s:
        principal = auth.authenticate(s, secret)
    if principal is None:
        limiter.failed(client)
        raise _unauthorized("invalid or revoked token")
    if not principal.has(scope):
        who = f"token {principal.name!r}" if principal.name else f"token {principal.token_id}"
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"{who} lacks the {scope!r} scope (it has: {', '.join(principal.scopes)})",
        )
    auth.touch(sessions, principal)
    return principal


def _authenticate(
    request: Request,
    creds: HTTPAuthorizationCredentials | None,
    sessions: sessionmaker[Session],
    scope: str,
) -> Principal:
    return check_token(
        sessions,
        creds.credentials if creds is not None else None,
        scope,
        request.app.state.auth_limiter,
        request.client.host if request.client else None,
    )


class Require:
    """A dependency: the caller's principal, which must hold ``scope`` (401/403 otherwise).
    ``app.api.auth_first.AuthFirst`` finds the routes that depend on one and checks their
    token before the body is read; the principal it found is taken from the request."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def __call__(self, request: Request, creds: Credentials, sessions: SessionsDep) -> Principal:
        found = request.scope.get("state", {}).get(AUTHENTICATED)
        if found is not None and found[0] == self.scope:
            principal: Principal = found[1]
            return principal
        return _authenticate(request, creds, sessions, self.scope)


def require(scope: auth.Scope) -> Callable[..., Principal]:
    """A dependency: the caller's principal, which must hold ``scope`` (401/403 otherwise)."""
    return Require(scope)


def read_access(
    request: Request, creds: Credentials, sessions: SessionsDep, settings: SettingsDep
) -> Principal | None:
    """GET routes: open unless ``auth_reads`` (then the 'read' scope is needed)."""
    if not settings.auth_reads:
        return None
    return _authenticate(request, creds, sessions, "read")


Reader = Annotated[Principal | None, Depends(read_access)]
Runner = Annotated[Principal, Depends(require("run"))]
Admin = Annotated[Principal, Depends(require("admin"))]
WorkerCaller = Annotated[Principal, Depends(require("worker"))]


def state(request: Request, name: str) -> Any:
    return getattr(request.app.state, name)
