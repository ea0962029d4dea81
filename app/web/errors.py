"""Error answers: an HTML page (extending base.html, with a link home) for a browser asking
for a page, JSON for the API (``/api/*``, ``/openapi.json``, probes) and for any client that
does not ask for HTML."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from app.api.hardening import CSP, SECURITY_HEADERS
from app.web.context import principal_of, templates

log = logging.getLogger(__name__)

MACHINE_PATHS = ("/api/", "/openapi.json", "/healthz", "/readyz", "/metrics")
SERVER_ERROR_TEXT = "the server failed to answer this request; the error is in its log"


def wants_html(request: Request) -> bool:
    """A browser navigating to a page: its ``Accept`` names ``text/html`` and not JSON,
    and the path is not the API's."""
    if request.url.path.startswith(MACHINE_PATHS):
        return False
    accept = request.headers.get("accept", "").lower()
    return "text/html" in accept and "application/json" not in accept


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_page(
    request: Request,
    status: int,
    detail: str,
    *,
    principal: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    ctx = {
        "request": request,
        "principal": principal,
        "nav": "",
        "csrf": "",
        "status": status,
        "title": _title(status),
        "detail": detail,
    }
    resp: Response = templates.TemplateResponse(
        request, "error.html", ctx, status_code=status, headers=dict(headers or {})
    )
    return resp


def _principal(request: Request) -> Any:
    """The signed-in principal for the page's header; a lookup that fails (the database is
    down) shows the header signed out rather than hiding the error being reported."""
    try:
        return principal_of(request)
    except Exception:
        log.warning("error page: could not look up the signed-in session", exc_info=True)
        return None


async def http_error(request: Request, exc: Exception) -> Response:
    """``HTTPException`` (404 and the others): the page or FastAPI's own JSON."""
    assert isinstance(exc, HTTPException)
    if not wants_html(request):
        return await http_exception_handler(request, exc)
    detail = exc.detail if isinstance(exc.detail, str) else _title(exc.status_code)
    return error_page(
        request, exc.status_code, detail, principal=_principal(request), headers=exc.headers
    )


async def server_error(request: Request, exc: Exception) -> Response:
    """An unhandled exception (Starlette logs it and re-raises after this answer): the 500
    page, or ``{"detail": ...}``. No session lookup: the database may be the cause. This
    answer bypasses the app's middleware, so it carries the security headers itself."""
    headers = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}
    if not wants_html(request):
        return JSONResponse({"detail": SERVER_ERROR_TEXT}, status_code=500, headers=headers)
    headers["Content-Security-Policy"] = CSP
    return error_page(request, 500, SERVER_ERROR_TEXT, headers=headers)
