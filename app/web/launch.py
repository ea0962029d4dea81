"""Write pages: launch a run (form POST) and sign in / out (token in an HttpOnly cookie)."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from starlette.requests import ClientDisconnect

from app.protocol.nul import NUL, NUL_REFUSED
from app.services import auth, bench_jobs, targets, web_sessions
from app.services import series as series_svc
from app.services.errors import ServiceError
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import launch_form, series_picker
from app.web.context import (
    COOKIE,
    CSRF_COOKIE,
    csrf_ok,
    off_loop,
    principal_of,
    reads_allowed,
    render,
    render_form,
    sessions_of,
    settings_of,
)

router = APIRouter(include_in_schema=False)

SIGNIN_CSRF_MAX_AGE_S = 3600
CSRF_REFUSED = (
    "this form did not come from this dashboard's own page (missing or stale CSRF token, or "
    "another origin): reload the page and send it again"
)
MAX_FORM_BYTES = 256 * 1024


async def form_values(request: Request) -> dict[str, str]:
    """An urlencoded form body as a dict (last value wins); no multipart needed. Read up to
    ``MAX_FORM_BYTES``: a bigger body, or one cut off, reads as an empty form (no CSRF
    token: every handler refuses it). Handlers that need a principal check it first. A NUL
    in any field's name or value is a 422 naming the field, before anything is done with the
    form (``app.protocol.nul``)."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return {}
    except ClientDisconnect:  # gone, or cut at the body limit (413 already answered)
        return {}
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    for name, value in pairs:
        if NUL in name or NUL in value:
            field = name.replace(NUL, "")
            raise HTTPException(422, f"{field}: {NUL_REFUSED}")
    return dict(pairs)


def _safe_next(target: str | None) -> str:
    if target and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"


def _launch(
    request: Request,
    values: dict[str, str],
    errors: dict[str, str],
    principal: Any,
    status_code: int | None = None,
) -> Response:
    return render_form(
        request,
        "launch.html",
        nav="launch",
        fields=launch_form.FIELDS,
        groups=launch_form.GROUPS,
        values=values,
        errors=errors,
        principal=principal,
        status_code=status_code,
        dataset_groups=launch_form.DATASET_GROUPS,
        endpoint_groups=launch_form.ENDPOINT_GROUPS,
        extra={"series_names": series_picker.names(request)},
    )


@router.get("/launch")
def launch_page(request: Request, again: str | None = None) -> Response:
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        return RedirectResponse("/signin?next=/launch", status_code=303)
    settings = settings_of(request)
    values = launch_form.defaults(settings)
    if again:
        with session_scope(sessions_of(request)) as s:
            row = repo.find_run(s, again)
            if row is not None and row.spec:
                values = launch_form.values_from_spec(dict(row.spec), row.name, settings)
    return _launch(request, values, {}, principal)


@router.post("/launch")
async def launch_submit(request: Request) -> Response:
    principal = principal_of(request)
    if principal is None or not principal.has("run"):  # before the body is read
        msg = "sign in with a token that has the 'run' scope to launch runs"
        defaults = launch_form.defaults(settings_of(request))
        return _launch(request, defaults, {"__all__": msg}, principal, 403)
    values = await form_values(request)
    if not csrf_ok(request, values):  # a signed-in browser's cookie, sent by another site
        return _launch(request, values, {"__all__": CSRF_REFUSED}, principal, 403)
    created, errors = launch_form.parse(values)
    series_name, series_errors = series_picker.chosen(values)
    if created is None or series_errors:  # the form again, messages beside the fields
        return _launch(request, values, errors | series_errors, principal)
    settings = settings_of(request)

    def create() -> str:
        spec = created.to_spec()
        targets.check_run_targets(spec.base_url, spec.metrics_url, settings, spec.base_urls)
        with session_scope(sessions_of(request)) as s:
            run_id, _job_id = bench_jobs.create_bench_run(
                s,
                created.to_spec(),
                requirements=created.requirements,
                name=created.name,
                max_attempts=settings.max_attempts,
                box=request.app.state.secretbox,
            )
            if series_name is not None:  # pending in its series until it finishes
                series_svc.join_run(s, series_name, run_id)
        return run_id

    try:
        run_id = await off_loop(create)
    except ServiceError as e:
        field = str(e.loc[-1]) if e.loc else "__all__"
        return _launch(request, values, {field: e.detail}, principal, e.status_code)
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/runs/{quote(run_id)}", status_code=303)


@router.get("/signin")
def signin_page(request: Request, next: str | None = None) -> Response:
    """The sign-in form; a fresh CSRF cookie goes with it (login CSRF: a page elsewhere must
    not sign a victim in with the attacker's token)."""
    fresh = None if request.cookies.get(CSRF_COOKIE) else secrets.token_urlsafe(32)
    if fresh is not None:
        request.state.new_csrf = fresh
    resp = render(
        request,
        "signin.html",
        {"nav": "signin", "next": _safe_next(next), "error": None},
        principal=principal_of(request),
    )
    if fresh is not None:
        resp.set_cookie(CSRF_COOKIE, fresh, **_cookie_flags(request, SIGNIN_CSRF_MAX_AGE_S))
    return resp


@router.post("/signin")
async def signin_submit(request: Request) -> Response:
    limiter: auth.FailureLimiter = request.app.state.auth_limiter
    client = request.client.host if request.client else None
    wait = limiter.retry_after(client)
    if wait is not None:  # before the body is read; the token is not even checked
        error = f"too many failed sign-ins from this address: try again in {wait} s"
        resp = render(request, "signin.html", {"nav": "signin", "next": "/", "error": error},
                      status_code=429)  # fmt: skip
        resp.headers["Retry-After"] = str(wait)
        return resp
    values = await form_values(request)
    secret = (values.get("token") or "").strip()
    nxt = _safe_next(values.get("next"))
    if not csrf_ok(request, values):
        ctx = {"nav": "signin", "next": nxt, "error": CSRF_REFUSED}
        return render(request, "signin.html", ctx, status_code=403)

    def open_() -> tuple[str, str] | None:
        with session_scope(sessions_of(request)) as s:
            principal = auth.authenticate(s, secret) if secret else None
            return web_sessions.open_session(s, principal) if principal is not None else None

    opened = await off_loop(open_)
    if opened is None:
        limiter.failed(client)
        return render(
            request,
            "signin.html",
            {"nav": "signin", "next": nxt, "error": "invalid or revoked token"},
            status_code=401,
        )
    resp = RedirectResponse(nxt, status_code=303)
    max_age = int(web_sessions.SESSION_TTL.total_seconds())
    resp.set_cookie(COOKIE, opened[0], **_cookie_flags(request, max_age))
    resp.delete_cookie(CSRF_COOKIE, path="/", httponly=True, samesite="strict")
    return resp


@router.post("/signout")
async def signout(request: Request) -> Response:
    values = await form_values(request)
    if not csrf_ok(request, values):
        return Response(CSRF_REFUSED, status_code=403, media_type="text/plain")
    secret = request.cookies.get(COOKIE)
    if secret:

        def close() -> None:
            with session_scope(sessions_of(request)) as s:
                web_sessions.close_session(s, secret)  # the cookie no longer works anywhere

        await off_loop(close)
    resp = RedirectResponse("/", status_code=303)
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return resp


def _cookie_flags(request: Request, max_age: int) -> dict[str, Any]:
    return {
        "max_age": max_age,
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": "/",
    }
