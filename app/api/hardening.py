"""Defences around the app: request body limits (413), security headers on every response
(a Content-Security-Policy on pages), opt-in CORS, 503 for a lost database connection,
422 answers that can always be written (the input they echo made JSON-safe), with
``auth_reads`` a read token (bearer or sign-in cookie) for ``/metrics`` and the API docs,
400 for a ``Host`` header outside ``allowed_hosts`` (DNS rebinding), and 400 for a NUL
(U+0000) in the path or the query string, before anything else runs (``app.protocol.nul``).

``harden(app, settings)`` installs them all; each piece is a plain ASGI middleware or an
exception handler so streaming responses pass through untouched.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.client.url_checks import without_credentials
from app.protocol.nul import NUL, NUL_REFUSED
from app.services import auth, web_sessions
from app.settings import Settings

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Worker result batches may be large; every other body gets the general limit.
UPLOAD_PATH = re.compile(r"^/api/v1/jobs/[^/]+/results$")
IMPORT_PATH = re.compile(r"^/(api/v1/imports|import)$")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
NO_CSP_PATHS: tuple[str, ...] = ()  # every page keeps the CSP, /docs included (docs_ui.py)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


def _too_large(limit: int, setting: str) -> tuple[int, bytes]:
    detail = {
        "detail": [
            {
                "loc": ["body"],
                "msg": f"request body larger than the {limit}-byte limit of this route ({setting})",
                "type": "too_large",
            }
        ]
    }
    return 413, json.dumps(detail).encode()


async def _send_json(
    send: Send, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """413 for a body over the route's limit: at once from ``Content-Length``, else while
    the app reads it (a chunked body is counted as it streams, never held here)."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, max_upload_bytes: int, max_import_bytes: int
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_import_bytes = max_import_bytes

    def limit_for(self, path: str) -> tuple[int, str]:
        """The route's body limit and the setting that sets it."""
        if UPLOAD_PATH.match(path):
            return self.max_upload_bytes, "TOKENTRACE_MAX_UPLOAD_BYTES"
        if IMPORT_PATH.match(path):
            return self.max_import_bytes, "TOKENTRACE_MAX_IMPORT_BYTES"
        return self.max_bytes, "TOKENTRACE_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit, setting = self.limit_for(scope.get("path", ""))
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared > limit:
                await _send_json(send, *_too_large(limit, setting))
                return
            if declared >= 0:  # the server enforces Content-Length framing
                await self.app(scope, receive, send)
                return
        await self.app(*_counted(scope, receive, send, limit, setting))


def _counted(
    scope: Scope, receive: Receive, send: Send, limit: int, setting: str
) -> tuple[Scope, Receive, Send]:
    """``receive`` and ``send`` for a body of unknown length: past ``limit`` bytes the 413
    goes out at once (unless the app already answered) and the app reads a disconnect, so
    nothing is held and nothing more is read; whatever the app answers then is dropped."""
    size = 0
    cut = False  # past the limit: the app reads a disconnect from now on
    answered = False  # the 413 went out
    started = False  # the app's own answer began

    async def receive_counted() -> Message:
        nonlocal size, cut, answered
        if cut:
            return {"type": "http.disconnect"}
        msg = await receive()
        if msg["type"] == "http.request":
            size += len(msg.get("body", b""))
            if size > limit:
                cut = True
                if not started:
                    await _send_json(send, *_too_large(limit, setting))
                    answered = True
                return {"type": "http.disconnect"}
        return msg

    async def send_unless_answered(msg: Message) -> None:
        nonlocal started
        if answered:
            return
        if msg["type"] == "http.response.start":
            started = True
        await send(msg)

    return scope, receive_counted, send_unless_answered


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return None


def host_of(header: str) -> str:
    """The host name of a ``Host`` header: lower case, without port, brackets or a final
    dot (``[::1]:8000`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1 : h.find("]")] if "]" in h else h[1:]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """``host`` is listed, or matches a ``*.domain`` pattern (sub-domains only), or ``*``."""
    for pattern in allowed:
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
            return True
    return False


class AllowedHosts:
    """400 for a request whose ``Host`` header (missing counts) names no allowed host:
    a DNS-rebinding page cannot reach the dashboard or the API through a name of its own."""

    def __init__(self, app: ASGIApp, *, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"host")
        host = host_of(header) if header is not None else ""
        if host and host_allowed(host, self.allowed):
            await self.app(scope, receive, send)
            return
        shown = (header or "")[:100]
        detail = (
            f"Host header {shown!r} is not served here; add the name to "
            "TOKENTRACE_ALLOWED_HOSTS (or set TOKENTRACE_PUBLIC_URL)"
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _send_json(send, 400, json.dumps({"detail": detail}).encode())


def _nul_field(query: bytes) -> str | None:
    """The name of the first query field whose name or value holds a NUL (``%00``)."""
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if NUL in name or NUL in value:
            return name.replace(NUL, "\\x00")
    return None


class NulGuard:
    """400 for a NUL (U+0000) in the path or the query string, for every caller and route:
    no identifier, name or filter holds one (PostgreSQL's text cannot: it was a 500).
    ``loc`` names ``["path"]`` or ``["query", <field>]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        query = bytes(scope.get("query_string") or b"")
        loc: list[str] | None = None
        if NUL in str(scope.get("path", "")):
            loc = ["path"]
        elif b"%00" in query or b"\x00" in query:
            loc = ["query", _nul_field(query) or ""]
        if loc is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        where = "the path" if loc == ["path"] else f"query field {loc[1]!r}"
        detail = [{"loc": loc, "msg": f"{where} {NUL_REFUSED}", "type": "nul_character"}]
        await _send_json(send, 400, json.dumps({"detail": detail}).encode())


READ_GATE_DETAIL = json.dumps(
    {"detail": "reads are protected: send 'Authorization: Bearer <token>' with the 'read' scope"}
).encode()


class ReadGate:
    """With ``auth_reads``: 401 for ``paths`` (``/metrics``, the OpenAPI document, ``/docs``,
    ``/redoc``) unless the request carries a token with the read scope, as a bearer token
    (a Prometheus scraper) or the dashboard's sign-in cookie (a browser on ``/docs``)."""

    def __init__(self, app: ASGIApp, *, paths: frozenset[str], cookie: str) -> None:
        self.app = app
        self.paths = paths
        self.cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        bearer = _bearer(scope)
        secret = bearer or _cookie(scope, self.cookie)
        allowed: bool | None = False
        limiter: auth.FailureLimiter = scope["app"].state.auth_limiter
        client = (scope.get("client") or (None,))[0]
        if secret is not None:
            wait = limiter.retry_after(client) if bearer else None
            if wait is not None:
                # too many failed token checks: this one is not made
                body = json.dumps({"detail": f"too many failed token checks: retry in {wait} s"})
                await _send_json(send, 429, body.encode(), ((b"retry-after", b"%d" % wait),))
                return
            try:
                allowed = await anyio.to_thread.run_sync(_may_read, scope["app"], secret)
            except SQLAlchemyError:  # as the routes answer a lost database: retryable
                body = json.dumps({"detail": "the database is unavailable; retry shortly"})
                await _send_json(send, 503, body.encode(), ((b"retry-after", b"1"),))
                return
        if allowed:
            await self.app(scope, receive, send)
            return
        if bearer is not None and allowed is None:  # no such token (not: a token without read)
            limiter.failed(client)
        await _send_json(send, 401, READ_GATE_DETAIL, ((b"www-authenticate", b"Bearer"),))


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization") or ""
    scheme, _, token = value.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def _cookie(scope: Scope, name: str) -> str | None:
    from starlette.requests import cookie_parser

    return cookie_parser(_header(scope, b"cookie") or "").get(name) or None


def _may_read(app: Any, secret: str) -> bool | None:
    """A read-scope API token, or a sign-in session whose token has the read scope: True;
    a token or session without it: False; neither: None."""
    with app.state.sessions() as s:
        principal = auth.authenticate(s, secret)
        if principal is None:
            found = web_sessions.signed_in(s, secret)
            principal = found.principal if found is not None else None
    return None if principal is None else principal.has("read")


class SecurityHeaders:
    """nosniff, a same-origin referrer policy and no framing on every response; a
    Content-Security-Policy (no inline script) on HTML pages."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        csp = not path.startswith(NO_CSP_PATHS)

        async def send_with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", []))
                present = {bytes(k).lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                ctype = next(
                    (bytes(v) for k, v in headers if bytes(k).lower() == b"content-type"), b""
                )
                if csp and ctype.startswith(b"text/html"):
                    headers.append((b"content-security-policy", CSP.encode()))
                msg["headers"] = headers
            await send(msg)

        await self.app(scope, receive, send_with_headers)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A dropped or exhausted database connection: 503 (the request changed nothing, its
    transaction was rolled back), so clients such as the worker retry it."""
    benign = isinstance(exc, DBAPIError) and not isinstance(exc, OperationalError)
    if benign and not getattr(exc, "connection_invalidated", False):
        raise exc  # an ordinary database error: the usual 500
    log.warning(
        "database unavailable for %s %s: %s",
        request.method,
        request.url.path,
        str(exc).splitlines()[0][:200],
    )
    return JSONResponse(
        {"detail": "the database connection was lost or is busy; retry shortly"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


MAX_ECHO_CHARS = 200  # of a bad input echoed in a 422
MAX_ECHO_INT = 10**30  # larger integers are echoed as a note (str() of 4300+ digits fails)
NO_ECHO_FIELDS = frozenset({"api_key"})  # a secret, even a refused one, is not sent back


def _echo(value: Any) -> tuple[bool, Any]:
    """(whether to echo, what) for a bad input: scalars as JSON can write them; containers
    (a whole body, a 900-deep list, a secret beside the bad field) are not echoed."""
    if value is None or isinstance(value, bool):
        return True, value
    if isinstance(value, int):
        return True, value if abs(value) < MAX_ECHO_INT else "an integer of 31 or more digits"
    if isinstance(value, float):
        return True, value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return True, value[:MAX_ECHO_CHARS]
    return False, None


def _ctx_value(value: Any) -> Any:
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, int | float):
        return _echo(value)[1]
    return str(value)[:MAX_ECHO_CHARS]


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 shape (``detail``: ``loc``, ``msg``, ``type``, ``input``, ``ctx``), but
    writable for any input: ``1e999`` (infinity) or a deeply nested value made FastAPI's own
    handler fail with a 500."""
    assert isinstance(exc, RequestValidationError)
    detail: list[dict[str, Any]] = []
    for err in exc.errors():
        out: dict[str, Any] = {
            "type": str(err.get("type", "value_error")),
            "loc": [p if isinstance(p, int) else str(p) for p in err.get("loc", ())],
            "msg": str(err.get("msg", "")),
        }
        if "input" in err and not NO_ECHO_FIELDS.intersection(map(str, err.get("loc", ()))):
            keep, shown = _echo(err["input"])
            if isinstance(shown, str):  # user:password@ of a URL
                shown = without_credentials(shown)
            if keep:
                out["input"] = shown
        ctx = err.get("ctx")
        if isinstance(ctx, dict):
            out["ctx"] = {str(k): _ctx_value(v) for k, v in ctx.items()}
        detail.append(out)
    return JSONResponse({"detail": detail}, status_code=422)


def harden(app: FastAPI, settings: Settings) -> None:
    """Install the Host allow-list, the NUL guard, the body limits, security headers, CORS
    (only with ``cors_origins``), the read gate on metrics and API docs (only with
    ``auth_reads``), the 503 handler for database connection loss, and the always-writable
    422."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(DBAPIError, _database_unavailable)
    app.add_exception_handler(PoolTimeout, _database_unavailable)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            allow_credentials=False,
        )
    if settings.auth_reads:
        from app.web.context import COOKIE

        docs = (app.openapi_url, "/docs", app.swagger_ui_oauth2_redirect_url)
        gated = frozenset({"/metrics", *(p for p in docs if p)})
        app.add_middleware(ReadGate, paths=gated, cookie=COOKIE)  # type: ignore[arg-type]
    app.add_middleware(SecurityHeaders)  # type: ignore[arg-type]
    app.add_middleware(
        BodyLimit,  # type: ignore[arg-type]
        max_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        max_import_bytes=settings.max_import_bytes,
    )
    app.add_middleware(NulGuard)  # type: ignore[arg-type]
    # outermost: a foreign Host is refused before anything else runs
    app.add_middleware(AllowedHosts, allowed=settings.host_allowlist())  # type: ignore[arg-type]
