"""Sweep page actions (form POSTs, post/redirect/get), as a run page's: tags, note, save
the sweep as a named baseline, pin or unpin it, and delete (after a confirmation page that
says what goes: the sweep, its steps' runs and their requests).

Each needs a signed-in principal with the ``run`` scope, the session's CSRF token and this
site's Origin, as ``runs_actions``; the work is the services' (``app.services.sweeps``,
``app.services.baselines``). A refused or invalid form changes nothing and shows the sweep
page again with a message beside the field it names."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from app.services import auth
from app.services import baselines as baseline_svc
from app.services import sweeps as sweep_svc
from app.services.auth import Principal
from app.services.errors import Invalid, NotFound, ServiceError
from app.storage import compare_repo
from app.storage.db import session_scope
from app.web.context import off_loop, principal_of, reads_allowed, render, sessions_of
from app.web.pickers import valid_id
from app.web.runs_actions import DELETE_CONFIRM, parse_tags, signed_form
from app.web.sweeps import render_sweep_page

router = APIRouter(include_in_schema=False)

NEEDS_RUN_SCOPE = "sign in with a token that has the 'run' scope to change sweeps"


async def _act(
    request: Request,
    sweep_id: str,
    field: str,
    work: Callable[[Session, dict[str, str]], str],
) -> Response:
    """Check the principal and the form, run ``work`` (returns the done key) in one
    session; on a refusal or a ServiceError show the sweep page with the message at
    ``field`` and the error's status."""
    principal = principal_of(request)
    values, refused = await signed_form(request, principal, NEEDS_RUN_SCOPE)
    if not valid_id(sweep_id):
        raise HTTPException(404, f"no sweep with id {sweep_id[:40]!r}")
    shown = {k: v for k, v in values.items() if k in ("tags", "note", "baseline_name")}
    errors: dict[str, str] | None = None
    code = 200
    if refused is not None:
        errors, code = {"__all__": refused[0]}, refused[1]
    else:

        def act() -> str:
            with session_scope(sessions_of(request)) as s:
                if compare_repo.find_sweep(s, sweep_id) is None:
                    raise NotFound(f"no sweep with id {sweep_id!r}")
                return work(s, values)

        try:
            done = await off_loop(act)
        except NotFound as e:
            raise HTTPException(404, e.detail) from None
        except ServiceError as e:
            errors, code = {field: e.detail}, e.status_code
    if errors is not None:
        return await render_sweep_page(
            request, sweep_id, principal=principal, errors=errors, values=shown, status_code=code
        )
    assert principal is not None
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/sweeps/{quote(sweep_id)}?done={done}#actions", status_code=303)


@router.post("/sweeps/{sweep_id}/tags")
async def set_tags(request: Request, sweep_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        try:
            tags = parse_tags(values.get("tags") or "")
        except ValueError as e:
            raise Invalid(f"tags: {e}", loc=("form", "tags")) from None
        sweep_svc.set_tags(s, sweep_id, tags)
        return "tags"

    return await _act(request, sweep_id, "tags", work)


@router.post("/sweeps/{sweep_id}/note")
async def set_note(request: Request, sweep_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        sweep_svc.set_note(s, sweep_id, values.get("note") or "")
        return "note"

    return await _act(request, sweep_id, "note", work)


@router.post("/sweeps/{sweep_id}/baseline")
async def save_baseline(request: Request, sweep_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        name = values.get("baseline_name") or ""
        try:
            baseline_svc.save(s, sweep_id, name, pin=values.get("pin") == "1")
        except Invalid as e:
            raise Invalid(f"baseline name: {e.detail}", loc=("form", "baseline_name")) from None
        return "baseline"

    return await _act(request, sweep_id, "baseline_name", work)


@router.post("/sweeps/{sweep_id}/baseline-pin")
async def pin_baseline(request: Request, sweep_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        name = values.get("name") or ""
        current = compare_repo.current_baseline(s, name) if name else None
        if current is None or current.sweep_id != sweep_id:
            raise Invalid(f"this sweep is not the current version of baseline {name!r}")
        pinned = values.get("pinned") == "1"
        baseline_svc.set_pin(s, name, pinned)
        return "pinned" if pinned else "unpinned"

    return await _act(request, sweep_id, "pin", work)


# -------------------------------------------------------------------------- delete


def _delete_page(
    request: Request,
    principal: Principal | None,
    sweep_id: str,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    if not valid_id(sweep_id):
        raise HTTPException(404, f"no sweep with id {sweep_id[:40]!r}")
    with session_scope(sessions_of(request)) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        if sweep is None:
            raise HTTPException(404, f"no sweep with id {sweep_id!r}")
        what = sweep_svc.contents(s, sweep_id)
        info = {"id": sweep.id, "name": sweep.name, "status": sweep.status, "job": sweep.job_id}
    return render(
        request,
        "sweep_delete.html",
        {
            "nav": "sweeps",
            "sweep": info,
            "what": what,
            "error": error,
            "can_act": principal is not None and principal.has("run"),
            "confirm_word": DELETE_CONFIRM,
        },
        principal=principal,
        status_code=status_code,
    )


@router.get("/sweeps/{sweep_id}/delete")
def delete_confirm(request: Request, sweep_id: str) -> Response:
    """The confirmation step: what goes, and a form that needs the word typed."""
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        return RedirectResponse(f"/signin?next=/sweeps/{quote(sweep_id)}/delete", 303)
    return _delete_page(request, principal, sweep_id)


@router.post("/sweeps/{sweep_id}/delete")
async def delete_sweep(request: Request, sweep_id: str) -> Response:
    principal = principal_of(request)
    values, refused = await signed_form(request, principal, NEEDS_RUN_SCOPE)
    if not valid_id(sweep_id):
        raise HTTPException(404, f"no sweep with id {sweep_id[:40]!r}")
    if refused is not None:
        return _delete_page(request, principal, sweep_id, refused[0], refused[1])
    if (values.get("confirm") or "").strip().lower() != DELETE_CONFIRM:
        msg = f"confirm: type {DELETE_CONFIRM!r} to delete this sweep"
        return _delete_page(request, principal, sweep_id, msg, 422)

    def delete() -> None:
        with session_scope(sessions_of(request)) as s:
            sweep_svc.delete_sweep(s, sweep_id)

    try:
        await off_loop(delete)
    except NotFound as e:
        raise HTTPException(404, e.detail) from None
    except ServiceError as e:
        return _delete_page(request, principal, sweep_id, e.detail, e.status_code)
    assert principal is not None
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/sweeps?deleted={quote(sweep_id)}", status_code=303)
