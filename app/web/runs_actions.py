"""Run page actions (form POSTs, post/redirect/get): cancel, delete (after a confirmation
page), tags, note, save the run as a named baseline, pin or unpin it.

Each needs a signed-in principal with the ``run`` scope, the session's CSRF token and this
site's Origin, as the REST API's ``Runner`` routes do; the work is the same services'
(``app.services.jobs``, ``app.storage.repository``, ``app.services.baselines``). A refused
or invalid form changes nothing and shows the run page again with a message beside the
field it names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from app.services import auth
from app.services import baselines as baseline_svc
from app.services import jobs as job_svc
from app.services.auth import Principal
from app.services.errors import Invalid, NotFound, ServiceError
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web.context import csrf_ok, off_loop, principal_of, reads_allowed, render, sessions_of
from app.web.launch import CSRF_REFUSED, form_values
from app.web.runs_render import render_run_page

router = APIRouter(include_in_schema=False)

MAX_TAGS = 100  # as the API's TagsBody
MAX_NOTE = 100_000  # as the API's NoteBody
NEEDS_RUN_SCOPE = "sign in with a token that has the 'run' scope to change runs"
DELETE_CONFIRM = "delete"  # what the confirmation field must say


def parse_tags(text: str) -> list[str]:
    """Comma-separated tags (blank: none). ValueError naming the problem; the storage
    layer checks each tag's length and trims and de-duplicates them."""
    tags = [t.strip() for t in text.split(",")]
    tags = [t for t in tags if t]
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    return tags


async def signed_form(
    request: Request, principal: Principal | None, needs_scope: str = ""
) -> tuple[dict[str, str], tuple[str, int] | None]:
    """The form's values and why it is refused (None: accepted). The principal is checked
    before the body is read: a refused caller's form is not read at all. ``needs_scope``:
    the refusal's text (default: a run's)."""
    if principal is None or not principal.has("run"):
        return {}, (needs_scope or NEEDS_RUN_SCOPE, 403)
    values = await form_values(request)
    if not csrf_ok(request, values):
        return values, (CSRF_REFUSED, 403)
    return values, None


def _done(run_id: str, key: str, anchor: str = "actions") -> RedirectResponse:
    return RedirectResponse(f"/runs/{quote(run_id)}?done={key}#{anchor}", status_code=303)


async def _act(
    request: Request,
    run_id: str,
    field: str,
    work: Callable[[Session, dict[str, str]], str],
) -> Response:
    """Check the principal and the form, run ``work`` (returns the done key) in one
    session; on a refusal or a ServiceError show the run page with the message at
    ``field`` (or the error's own field) and the status of the error."""
    principal = principal_of(request)
    values, refused = await signed_form(request, principal)
    shown = {k: v for k, v in values.items() if k in ("tags", "note", "baseline_name")}
    if refused is not None:
        msg, code = refused
        return await render_run_page(
            request,
            run_id,
            principal=principal,
            errors={"__all__": msg},
            values=shown,
            status_code=code,
        )

    def act() -> str:
        with session_scope(sessions_of(request)) as s:
            if repo.find_run(s, run_id) is None:
                raise NotFound(f"no run with id {run_id!r}")
            return work(s, values)

    try:
        done = await off_loop(act)
    except NotFound as e:
        raise HTTPException(404, e.detail) from None
    except ServiceError as e:
        return await render_run_page(
            request,
            run_id,
            principal=principal,
            errors={field: e.detail},
            values=shown,
            status_code=e.status_code,
        )
    assert principal is not None
    await off_loop(auth.touch, sessions_of(request), principal)
    return _done(run_id, done)


@router.post("/runs/{run_id}/tags")
async def set_tags(request: Request, run_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        try:
            repo.set_tags(s, run_id, parse_tags(values.get("tags") or ""))
        except (ValueError, TypeError) as e:
            raise Invalid(f"tags: {e}", loc=("form", "tags")) from None
        return "tags"

    return await _act(request, run_id, "tags", work)


@router.post("/runs/{run_id}/note")
async def set_note(request: Request, run_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        note = (values.get("note") or "").strip()
        if len(note) > MAX_NOTE:
            raise Invalid(f"note: at most {MAX_NOTE:,} characters", loc=("form", "note"))
        repo.set_note(s, run_id, note or None)
        return "note"

    return await _act(request, run_id, "note", work)


@router.post("/runs/{run_id}/baseline")
async def save_baseline(request: Request, run_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        name = values.get("baseline_name") or ""
        try:
            baseline_svc.save(s, run_id, name, pin=values.get("pin") == "1")
        except Invalid as e:
            raise Invalid(f"baseline name: {e.detail}", loc=("form", "baseline_name")) from None
        return "baseline"

    return await _act(request, run_id, "baseline_name", work)


@router.post("/runs/{run_id}/baseline-pin")
async def pin_baseline(request: Request, run_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        name = values.get("name") or ""
        current = compare_repo.current_baseline(s, name) if name else None
        if current is None or current.run_id != run_id:
            raise Invalid(f"this run is not the current version of baseline {name!r}")
        pinned = values.get("pinned") == "1"
        baseline_svc.set_pin(s, name, pinned)
        return "pinned" if pinned else "unpinned"

    return await _act(request, run_id, "pin", work)


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: str) -> Response:
    def work(s: Session, values: dict[str, str]) -> str:
        r = job_svc.cancel_run(s, run_id)
        return "cancel-requested" if r.cancel_requested else "cancelled"

    return await _act(request, run_id, "cancel", work)


# -------------------------------------------------------------------------- delete


def _delete_page(
    request: Request,
    principal: Principal | None,
    run_id: str,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        run: dict[str, Any] = {"id": row.id, "name": row.name, "status": str(row.status)}
        n_requests = repo.count_requests(s, run_id)
    return render(
        request,
        "run_delete.html",
        {
            "nav": "runs",
            "run": run,
            "n_requests": n_requests,
            "error": error,
            "can_act": principal is not None and principal.has("run"),
            "confirm_word": DELETE_CONFIRM,
        },
        principal=principal,
        status_code=status_code,
    )


@router.get("/runs/{run_id}/delete")
def delete_confirm(request: Request, run_id: str) -> Response:
    """The confirmation step: what goes, and a form that needs the word typed."""
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        return RedirectResponse(f"/signin?next=/runs/{quote(run_id)}/delete", status_code=303)
    return _delete_page(request, principal, run_id)


@router.post("/runs/{run_id}/delete")
async def delete_run(request: Request, run_id: str) -> Response:
    principal = principal_of(request)
    values, refused = await signed_form(request, principal)
    if refused is not None:
        return _delete_page(request, principal, run_id, refused[0], refused[1])
    if (values.get("confirm") or "").strip().lower() != DELETE_CONFIRM:
        msg = f"confirm: type {DELETE_CONFIRM!r} to delete this run"
        return _delete_page(request, principal, run_id, msg, 422)

    def delete() -> None:
        with session_scope(sessions_of(request)) as s:
            job_svc.delete_run(s, run_id)

    try:
        await off_loop(delete)
    except NotFound as e:
        raise HTTPException(404, e.detail) from None
    except ServiceError as e:
        return _delete_page(request, principal, run_id, e.detail, e.status_code)
    assert principal is not None
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/?deleted={quote(run_id)}", status_code=303)
