"""API tokens: ``tt_<random>`` secrets, stored as SHA-256 digests, with scopes.

Scopes: ``read`` (GET routes, when reads are protected), ``run`` (create, cancel, delete,
tag and annotate runs; implies read), ``admin`` (tokens; implies every other scope) and
``worker`` (only the worker protocol routes, only for jobs leased to its own workers).

Failed sign-ins and bearer-token checks are counted per client address
(``FailureLimiter``): after ``auth_max_failures`` within ``auth_failure_window_s`` the
address gets 429 (with ``Retry-After``) for the rest of the window, whatever it sends.

``tokentrace serve``'s embedded worker gets its own token, named ``local-worker@<server
URL>`` (a name no one else may give a token): revoked when the server stops, and, should
the server have been killed before it could, when a server at that URL starts again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from sqlalchemy.orm import Session, sessionmaker

from app.services.errors import Invalid
from app.storage import tokens as token_repo
from app.storage.db import session_scope
from app.storage.models import ApiToken, utcnow

Scope = Literal["read", "run", "admin", "worker"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
IMPLIED: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "run": frozenset({"run", "read"}),
    "admin": frozenset({"admin", "run", "read", "worker"}),
    "worker": frozenset({"worker"}),
}
SECRET_PREFIX = "tt_"
TOUCH_EVERY = dt.timedelta(seconds=60)  # last_used_at is refreshed at most this often
LOCAL_WORKER = "local-worker"  # the embedded worker's token: LOCAL_WORKER@<server URL>


@dataclass(frozen=True)
class Principal:
    """Who called: a valid, unrevoked token."""

    token_id: str
    name: str | None
    scopes: tuple[str, ...]  # as granted
    effective: frozenset[str]  # with implied scopes

    def has(self, scope: str) -> bool:
        return scope in self.effective

    @property
    def is_admin(self) -> bool:
        return "admin" in self.effective


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def generate_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def effective_scopes(scopes: list[str] | tuple[str, ...]) -> frozenset[str]:
    out: set[str] = set()
    for s in scopes:
        out |= IMPLIED.get(s, frozenset())
    return frozenset(out)


def normalize_scopes(scopes: list[str] | tuple[str, ...]) -> list[str]:
    """Validated, de-duplicated scopes; ValueError names an unknown one."""
    out: list[str] = []
    for s in scopes:
        if s not in SCOPES:
            raise ValueError(f"unknown scope {s!r}; choose from {', '.join(SCOPES)}")
        if s not in out:
            out.append(s)
    if not out:
        raise ValueError(f"a token needs at least one scope ({', '.join(SCOPES)})")
    return out


def create_token(
    session: Session, *, scopes: list[str] | tuple[str, ...], name: str | None = None
) -> tuple[ApiToken, str]:
    """A new token row and its secret (shown once; only its digest is stored). A name of
    the embedded worker's form is refused (``Invalid``, 422 naming ``name``)."""
    if name is not None and name.startswith(LOCAL_WORKER + "@"):
        raise Invalid(
            f"name: names starting {LOCAL_WORKER}@ are kept for `tokentrace serve`'s "
            "embedded worker",
            loc=("body", "name"),
        )
    return _create(session, scopes, name)


def _create(
    session: Session, scopes: list[str] | tuple[str, ...], name: str | None
) -> tuple[ApiToken, str]:
    granted = normalize_scopes(scopes)
    secret = generate_secret()
    row = token_repo.insert_token(
        session, name=name, scopes=granted, digest=hash_secret(secret), prefix=secret[:10]
    )
    return row, secret


def authenticate(session: Session, secret: str) -> Principal | None:
    """The principal of a valid, unrevoked token secret, else None."""
    if not secret.startswith(SECRET_PREFIX) or len(secret) > 200:
        return None
    digest = hash_secret(secret)
    row = token_repo.find_by_hash(session, digest)
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.hash, digest):
        return None
    return Principal(
        token_id=row.id,
        name=row.name,
        scopes=tuple(row.scopes),
        effective=effective_scopes(list(row.scopes)),
    )


def touch(sessions: sessionmaker[Session], principal: Principal) -> None:
    """Record that a token was used (in its own short transaction, throttled)."""
    now = utcnow()
    with session_scope(sessions) as s:
        row = token_repo.get_token(s, principal.token_id)
        if row is not None and (row.last_used_at is None or now - row.last_used_at > TOUCH_EVERY):
            token_repo.touch(s, principal.token_id, now)


def list_tokens(session: Session) -> list[ApiToken]:
    return token_repo.list_tokens(session)


def revoke_token(session: Session, token_id: str) -> ApiToken | None:
    return token_repo.revoke(session, token_id)


def client_key(host: str | None) -> str:
    """Whom a failure is counted against: an IPv4 address, or an IPv6 address's /64 (one
    host usually holds a whole /64, and could otherwise walk through it)."""
    if not host:
        return "unknown"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(slots=True)
class _Failures:
    since: float  # the window's start (monotonic s): the first failure in it
    count: int


class FailureLimiter:
    """Failed sign-ins and token checks per client (``client_key``): after
    ``max_failures`` within ``window_s`` of the first, ``retry_after`` says how many whole
    seconds remain until the window ends (callers answer 429 without checking anything).
    Successful checks neither count nor reset. At most ``max_clients`` clients are
    remembered, the one that failed least recently forgotten first: memory stays bounded
    whatever the callers. Thread-safe; one per app (``app.state.auth_limiter``)."""

    def __init__(
        self,
        *,
        max_failures: int,
        window_s: float,
        max_clients: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def retry_after(self, host: str | None) -> int | None:
        """Seconds until ``host`` may try again, or None when it may now."""
        key, now = client_key(host), self._clock()
        with self._lock:
            f = self._seen.get(key)
            if f is None:
                return None
            if now - f.since >= self.window_s:
                del self._seen[key]
                return None
            if f.count < self.max_failures:
                return None
            return max(1, math.ceil(f.since + self.window_s - now))

    def failed(self, host: str | None) -> None:
        """Count one failure of ``host``."""
        key, now = client_key(host), self._clock()
        with self._lock:
            f = self._seen.pop(key, None)
            if f is None or now - f.since >= self.window_s:
                f = _Failures(now, 0)
            f.count += 1
            self._seen[key] = f  # now the most recent
            while len(self._seen) > self.max_clients:
                self._seen.popitem(last=False)


def local_worker_name(server_url: str) -> str:
    return f"{LOCAL_WORKER}@{server_url}"


def revoke_local_worker_tokens(session: Session, server_url: str) -> list[str]:
    """Revoke every live embedded-worker token of a server at ``server_url`` (one a killed
    server left; or, of a version before these names, one named ``local-worker``): the ids
    revoked. ``tokentrace serve`` calls it as it starts."""
    names = {local_worker_name(server_url), LOCAL_WORKER}
    left = [t for t in token_repo.list_tokens(session, include_revoked=False) if t.name in names]
    for t in left:
        token_repo.revoke(session, t.id)
    return [t.id for t in left]


def create_local_worker_token(session: Session, server_url: str) -> tuple[ApiToken, str]:
    """A fresh ``worker`` token for the embedded worker of the server at ``server_url``."""
    return _create(session, ["worker"], local_worker_name(server_url))
