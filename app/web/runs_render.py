"""The run page's response (GET /runs/{id}, and a failed action form shown again with its
messages): the run's context plus what the action forms need (``actions_context``)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import HTTPException, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.services import runs as run_svc
from app.services.auth import Principal
from app.services.run_summaries import PROFILE_NAMES
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import runs_view
from app.web.context import render, sessions_of
from app.web.interop_run import add_interop
from app.web.run_agents import add_agents
from app.web.run_series import add_series
from app.web.run_turns import add_turns, run_groups, run_processes, run_shards
from app.web.runs_page import load_run, run_context

# what a successful action says on the page it redirects to (``?done=KEY``)
DONE_TEXT = {
    "tags": "Tags saved.",
    "note": "Note saved.",
    "baseline": "Baseline saved.",
    "pinned": "Baseline pinned.",
    "unpinned": "Baseline unpinned.",
    "cancelled": "Run cancelled.",
    "cancel-requested": "Cancel requested: the worker stops the run at its next heartbeat.",
}


def baselines_of_run(s: Session, run_id: str) -> list[dict[str, Any]]:
    """The current baseline versions that point at this run, by name."""
    return [
        {"name": b.name, "version": b.version, "pinned": b.pinned}
        for b in compare_repo.list_baselines(s)
        if b.run_id == run_id
    ]


def compare_baselines(s: Session, run_id: str) -> list[dict[str, Any]]:
    """The saved baselines this run can be compared with: the current versions that point
    at another run that still exists, by name, with that run's name."""
    out = []
    for b in compare_repo.list_baselines(s):
        if b.run_id is None or b.run_id == run_id:
            continue
        row = repo.find_run(s, b.run_id)
        if row is not None:
            out.append({"name": b.name, "version": b.version, "run": row.name or row.id})
    return out


def actions_context(
    request: Request,
    principal: Principal | None,
    run: dict[str, Any],
    *,
    errors: dict[str, str] | None = None,
    values: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``can_act`` (the principal has the ``run`` scope), the form values shown (the run's
    own unless a failed post's), the field messages, the done message and the baselines."""
    run_id = str(run["id"])
    with session_scope(sessions_of(request)) as s:
        baselines = baselines_of_run(s, run_id)
        others = compare_baselines(s, run_id)
    shown = {
        "tags": ", ".join(run.get("tags") or []),
        "note": str(run.get("note") or ""),
        "baseline_name": "",
    } | (values or {})
    return {
        "can_act": principal is not None and principal.has("run"),
        "action_errors": errors or {},
        "action_values": shown,
        "done": DONE_TEXT.get(request.query_params.get("done") or ""),
        "run_baselines": baselines,
        "compare_baselines": others,
        "cancellable": str(run.get("status")) in runs_view.ACTIVE_RUN_STATES,
    }


async def render_run_page(
    request: Request,
    run_id: str,
    *,
    principal: Principal | None,
    errors: dict[str, str] | None = None,
    values: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    """The run page (404 when there is no such run)."""
    query = {k: v for k, v in request.query_params.items()}
    slos, slo_errors = runs_view.parse_slos(query)
    profile = query.get("profile") or "tokentrace"
    prof = profile if profile in PROFILE_NAMES else "tokentrace"

    def build() -> dict[str, Any]:
        data = load_run(sessions_of(request), run_id, profile=prof)
        ctx = run_context(data, slos_ms=slos, slo_errors=slo_errors, profile=prof)
        add_interop(ctx, sessions_of(request), run_id, data.summary)  # imports, server metrics
        add_turns(ctx, sessions_of(request), run_id)  # a multi-turn run's metrics by turn
        add_agents(ctx, sessions_of(request), run_id, query)  # an agent trace's sessions
        ctx["run_processes"] = run_processes(ctx.get("run") or {})  # a dealt run's processes
        ctx["run_shards"] = run_shards(ctx.get("run") or {})  # a run dealt over workers
        ctx["run_groups"] = run_groups(ctx.get("run") or {})  # several models / targets
        add_series(ctx, sessions_of(request), run_id)  # its series, if any
        run = dict(data.run) | {"note": data.note}
        ctx |= actions_context(request, principal, run, errors=errors, values=values)
        return ctx

    try:
        ctx = await anyio.to_thread.run_sync(build)
    except run_svc.RunNotFound:
        raise HTTPException(404, f"no run with id {run_id!r}") from None
    ctx["nav"] = "runs"
    ctx["slo_query"] = {k: v for k, v in query.items() if k.startswith("slo")}
    return render(request, "run.html", ctx, principal=principal, status_code=status_code)
