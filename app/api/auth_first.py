"""Authenticate before a body is read (``AuthFirst``, an ASGI middleware).

FastAPI reads and parses a route's body (``json.loads`` of the bytes, a multipart form)
before it runs the route's dependencies, so a token check written as a dependency answers
an anonymous caller only after taking its body in whole: 64 MiB of JSON parsed (1.8 GB) for
a 401. ``AuthFirst`` runs first. A request to the REST API that may carry a body (any
method but GET, HEAD and OPTIONS) needs a bearer token with the scope its route asks for
(``scope_for``: the worker protocol ``worker``, tokens ``admin``, every other write
``run``); without one the answer is the 401 or 403 the route's ``deps.require`` dependency
would give, the body unread (``Connection: close``). The principal found goes on in the
request's state, so the dependency does not look the token up again (it still checks its
own scope: this table only ever refuses earlier, never lets more through;
``tests/test_auth_before_body.py`` holds it to every route's dependency).

The pages' form posts pass through: they are signed in by cookie, and each handler checks
the principal before it reads its form (``app.web``).
"""

from __future__ import annotations

import json
import re
import time

import anyio
from fastapi import HTTPException
from sqlalchemy.exc import SQLAlchemyError

from app.api.deps import AUTHENTICATED, check_token
from app.api.hardening import ASGIApp, Receive, Scope, Send, _bearer, _send_json

BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
WORKER_PATHS = re.compile(
    r"^/api/v1/(workers/register|workers/[^/]+/lease|jobs/[^/]+/"
    r"(heartbeat|shard-ready|results|complete|steps|steps/[^/]+/complete|probe-result|telemetry))$"
)
ADMIN_PATHS = re.compile(r"^/api/v1/tokens(/[^/]+)?$")


def scope_for(method: str, path: str) -> str | None:
    """The token scope a request must carry before its body is read; None: not checked
    here (reads, pages)."""
    if method in BODYLESS or not path.startswith("/api/"):
        return None
    if WORKER_PATHS.match(path):
        return "worker"
    if ADMIN_PATHS.match(path):
        return "admin"
    return "run"


class AuthFirst:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        needed = None
        if scope["type"] == "http":
            # a clock exchange's receipt (heartbeat, shard-ready): before the token check,
            # whose time would otherwise count as the way in only and bias the offset
            scope.setdefault("state", {})["clock_t2_ns"] = time.time_ns()
            needed = scope_for(str(scope.get("method", "")), str(scope.get("path", "")))
        if needed is None:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        client = scope.get("client")
        try:
            principal = await anyio.to_thread.run_sync(
                check_token,
                state.sessions,
                _bearer(scope),
                needed,
                state.auth_limiter,
                client[0] if client else None,
            )
        except HTTPException as e:
            headers = tuple((k.lower().encode(), v.encode()) for k, v in (e.headers or {}).items())
            body = json.dumps({"detail": e.detail}).encode()
            await _send_json(send, e.status_code, body, headers)
            return
        except SQLAlchemyError:  # as the routes answer a lost database: retryable
            body = json.dumps({"detail": "the database is unavailable; retry shortly"}).encode()
            await _send_json(send, 503, body, ((b"retry-after", b"1"),))
            return
        scope.setdefault("state", {})[AUTHENTICATED] = (needed, principal)
        await self.app(scope, receive, send)
