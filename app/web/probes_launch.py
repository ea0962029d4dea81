"""Probes from the browser: the probe form queues a probe job, as ``POST /api/v1/probes``
does (a worker started with ``--kind probe``, or the embedded one where torch is installed,
runs it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from app.probes.spec import ProbeSpec
from app.services import auth, probe_jobs
from app.services import probes as probe_svc
from app.services.errors import ServiceError
from app.storage.db import session_scope
from app.web import probes_form as probe_form
from app.web.context import (
    csrf_ok,
    off_loop,
    principal_of,
    reads_allowed,
    render_form,
    sessions_of,
    settings_of,
)
from app.web.launch import CSRF_REFUSED, form_values

router = APIRouter(include_in_schema=False)


def _form(
    request: Request,
    values: dict[str, str],
    errors: dict[str, str],
    principal: Any,
    status_code: int | None = None,
) -> Response:
    return render_form(
        request,
        "probe_launch.html",
        nav="probes",
        fields=probe_form.FIELDS,
        groups=probe_form.GROUPS,
        values=values,
        errors=errors,
        principal=principal,
        status_code=status_code,
    )


@router.get("/launch/probe")
def probe_launch_page(request: Request) -> Response:
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        return RedirectResponse("/signin?next=/launch/probe", status_code=303)
    return _form(request, probe_form.defaults(), {}, principal)


@router.post("/launch/probe")
async def probe_launch_submit(request: Request) -> Response:
    """Queue a probe job; errors beside the fields (nothing is created)."""
    principal = principal_of(request)
    if principal is None or not principal.has("run"):  # before the body is read
        msg = "sign in with a token that has the 'run' scope to launch probes"
        return _form(request, probe_form.defaults(), {"__all__": msg}, principal, 403)
    values = await form_values(request)
    if not csrf_ok(request, values):
        return _form(request, values, {"__all__": CSRF_REFUSED}, principal, 403)
    created, errors = probe_form.parse(values)
    if created is None:
        return _form(request, values, errors, principal)
    spec = ProbeSpec.model_validate(created.model_dump(exclude={"requirements"}))

    def submit() -> str:
        with session_scope(sessions_of(request)) as s:
            probe_id, _job_id = probe_jobs.submit(
                s,
                spec,
                requirements=created.requirements,
                max_attempts=settings_of(request).max_attempts,
            )
        return probe_id

    try:
        probe_id = await off_loop(submit)
    except ServiceError as e:
        return _form(request, values, {"__all__": e.detail}, principal, e.status_code)
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/probes/{quote(probe_id)}", status_code=303)


@router.get("/probes/{probe_id}/status.json")
def probe_status(request: Request, probe_id: str) -> JSONResponse:
    """The probe's status and error (its page polls this while it is queued or running)."""
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        raise HTTPException(401, "sign in to read probes")
    with session_scope(sessions_of(request)) as s:
        try:
            p = probe_svc.get_view(s, probe_id)
        except ServiceError as e:
            raise HTTPException(e.status_code, e.detail) from None
    return JSONResponse({"probe_id": probe_id, "status": p["status"], "error": p.get("error")})
