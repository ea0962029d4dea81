"""Sweeps from the browser: the sweep form (queue one for a worker), the sweep page's live
state as JSON (static/app.js polls it and reloads the page per finished step), and cancel."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from app.client import sweep_plan
from app.domain import RunStatus
from app.services import auth, sweep_jobs, targets
from app.services import series as series_svc
from app.services.errors import ServiceError
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import launch_form, series_picker
from app.web import sweeps_form as sweep_form
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

ACTIVE_SWEEP = ("queued", "running")
DONE_RUN = {s.value for s in RunStatus} - {RunStatus.QUEUED.value, RunStatus.RUNNING.value}


@dataclass(frozen=True, slots=True)
class SweepLive:
    """Where a sweep stands, for its page and its progress JSON."""

    sweep_id: str
    status: str
    active: bool  # queued or running: the page keeps polling
    stop_reason: str | None
    steps: int  # step runs created so far
    finished_steps: int  # of those, runs that ended
    planned: int | None  # steps the plan will run at most (None: not known, e.g. imported)
    job_id: str | None
    job_state: str | None
    cancel_requested: bool
    cancellable: bool
    text: str  # one line: "step 2 of 5: running 40/100" / "queued: waiting for a worker"


def sweep_live(session: Session, sweep_id: str) -> SweepLive | None:
    sweep = compare_repo.find_sweep(session, sweep_id)
    if sweep is None:
        return None
    job = job_repo.get_job(session, sweep.job_id) if sweep.job_id else None
    steps = compare_repo.sweep_steps(session, sweep_id)
    statuses = [str(repo.get_run(session, st.run_id).status) for st in steps]
    finished = sum(1 for s in statuses if s in DONE_RUN)
    planned: int | None = None
    # a sweep the server sequences (steps dealt over workers) keeps its plan; a worker's, its job
    plan_data = (sweep.plan or {}).get("plan")
    if plan_data is None and job is not None:
        plan_data = (job.spec or {}).get("plan")
    if isinstance(plan_data, dict):
        try:
            planned = sweep_plan.planned_steps(sweep_plan.plan_of(plan_data))
        except (ValueError, KeyError, TypeError):
            planned = None
    elif sweep.loads:
        planned = len(sweep.loads)
    status = str(sweep.status)
    active = status in ACTIVE_SWEEP
    job_state = str(job.state) if job is not None else None
    cancel_requested = bool(job.cancel_requested) if job is not None else False
    cancellable = (
        active and job is not None and job_state in ("queued", *job_repo.ACTIVE_STATES)
        and not cancel_requested
    )  # fmt: skip
    of = f" of {planned}" if planned else ""
    if not active:
        text = f"{status}: {finished} step(s) finished"
    elif job_state == "queued":
        text = f"queued: waiting for a worker ({finished} step(s) finished)"
    else:
        prog = (job.progress or {}) if job is not None else {}
        done, total = prog.get("done"), prog.get("planned")
        current = f": {int(done)}/{int(total)} requests" if done is not None and total else ""
        text = (
            f"running step {len(steps)}{of}{current} ({finished} finished)"
            if steps
            else "starting on a worker"
        )
        if cancel_requested:
            text += " · cancel requested: the worker stops at its next heartbeat"
    shards = int((sweep.spec or {}).get("shards") or 1)
    if shards > 1:
        text += f" · each step one run dealt over {shards} workers (By shard on its run page)"
    return SweepLive(
        sweep_id=sweep_id,
        status=status,
        active=active,
        stop_reason=sweep.stop_reason,
        steps=len(steps),
        finished_steps=finished,
        planned=planned,
        job_id=job.id if job is not None else None,
        job_state=job_state,
        cancel_requested=cancel_requested,
        cancellable=cancellable,
        text=text,
    )


def _form(
    request: Request,
    values: dict[str, str],
    errors: dict[str, str],
    principal: Any,
    status_code: int | None = None,
) -> Response:
    return render_form(
        request,
        "sweep_launch.html",
        nav="sweeps",
        fields=sweep_form.FIELDS,
        groups=sweep_form.GROUPS,
        values=values,
        errors=errors,
        principal=principal,
        status_code=status_code,
        dataset_groups=launch_form.DATASET_GROUPS,
        endpoint_groups=launch_form.ENDPOINT_GROUPS,
        extra={"series_names": series_picker.names(request)},
    )


@router.get("/launch/sweep")
def sweep_launch_page(request: Request, again: str | None = None) -> Response:
    """The sweep form: the server's default target, or (``again``) a stored sweep's."""
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        return RedirectResponse("/signin?next=/launch/sweep", status_code=303)
    settings = settings_of(request)
    values = sweep_form.defaults(settings)
    if again:
        with session_scope(sessions_of(request)) as s:
            sweep = compare_repo.find_sweep(s, again)
            if sweep is not None and sweep.spec:
                job = job_repo.get_job(s, sweep.job_id) if sweep.job_id else None
                plan = (job.spec or {}).get("plan") if job is not None else None
                reqs = dict(job.requirements or {}) if job is not None else None
                if sweep.plan:  # steps dealt over workers: the sweep keeps plan and needs
                    plan, reqs = sweep.plan.get("plan"), dict(sweep.plan.get("requirements") or {})
                if not isinstance(plan, dict) and sweep.find_max:  # a find-max sweep run here
                    plan = {"find_max": dict(sweep.find_max)}
                values = sweep_form.values_from_sweep(
                    dict(sweep.spec),
                    str(sweep.mode),
                    list(sweep.loads or []),
                    plan if isinstance(plan, dict) else None,
                    sweep.name,
                    settings,
                    reqs,
                )
    return _form(request, values, {}, principal)


@router.post("/launch/sweep")
async def sweep_launch_submit(request: Request) -> Response:
    """Queue a sweep for a worker, as ``POST /api/v1/sweeps`` does; errors beside the fields
    (nothing is created)."""
    principal = principal_of(request)
    if principal is None or not principal.has("run"):  # before the body is read
        msg = "sign in with a token that has the 'run' scope to launch sweeps"
        defaults = sweep_form.defaults(settings_of(request))
        return _form(request, defaults, {"__all__": msg}, principal, 403)
    values = await form_values(request)
    if not csrf_ok(request, values):
        return _form(request, values, {"__all__": CSRF_REFUSED}, principal, 403)
    parsed, errors = sweep_form.parse(values)
    series_name, series_errors = series_picker.chosen(values)
    if parsed is None or series_errors:
        return _form(request, values, errors | series_errors, principal)
    created, plan = parsed
    settings = settings_of(request)

    def create() -> str:
        targets.check_run_targets(
            created.base_url, created.metrics_url, settings, created.base_urls
        )
        with session_scope(sessions_of(request)) as s:
            sweep_id, _job_id = sweep_jobs.create_sweep_job(
                s,
                created.base_spec(),
                plan,
                box=request.app.state.secretbox,
                requirements=created.requirements,
                name=created.name,
                max_attempts=settings.max_attempts,
            )
            if series_name is not None:  # its step runs join the series as they finish
                series_svc.join_sweep(s, series_name, sweep_id)
        return sweep_id

    try:
        sweep_id = await off_loop(create)
    except ServiceError as e:
        field = str(e.loc[-1]) if e.loc else "__all__"
        return _form(request, values, {field: e.detail}, principal, e.status_code)
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/sweeps/{quote(sweep_id)}", status_code=303)


@router.get("/sweeps/{sweep_id}/progress.json")
def sweep_progress(request: Request, sweep_id: str) -> JSONResponse:
    """The sweep's state and step counts (its page polls this and reloads per step)."""
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        raise HTTPException(401, "sign in to read sweeps")
    with session_scope(sessions_of(request)) as s:
        live = sweep_live(s, sweep_id)
    if live is None:
        raise HTTPException(404, f"no sweep with id {sweep_id!r}")
    return JSONResponse(asdict(live))


@router.post("/sweeps/{sweep_id}/cancel")
async def sweep_cancel(request: Request, sweep_id: str) -> Response:
    """Cancel from the sweep's page: queued, it ends now; on a worker, it stops at the next
    heartbeat (finished steps are kept)."""
    principal = principal_of(request)
    if principal is None or not principal.has("run"):  # before the body is read
        raise HTTPException(403, "sign in with a token that has the 'run' scope to cancel")
    values = await form_values(request)
    if not csrf_ok(request, values):
        raise HTTPException(403, CSRF_REFUSED)

    def cancel() -> None:
        with session_scope(sessions_of(request)) as s:
            sweep_jobs.cancel_sweep(s, sweep_id)

    try:
        await off_loop(cancel)
    except ServiceError as e:
        raise HTTPException(e.status_code, e.detail) from None
    await off_loop(auth.touch, sessions_of(request), principal)
    return RedirectResponse(f"/sweeps/{quote(sweep_id)}", status_code=303)
