"""The sweeps list and a sweep's page (its steps, curves and live state); launching one is
``sweeps_launch``, comparing two is ``compare``."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from app.services import sweeps as sweep_svc
from app.services.errors import NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import runs_view
from app.web.compare import sweep_figures
from app.web.context import read_gate, render, sessions_of
from app.web.sweeps_launch import sweep_live

router = APIRouter(include_in_schema=False)


@router.get("/sweeps")
def sweeps_page(request: Request) -> Response:
    """Every sweep, newest first (max goodput is on each sweep's page: it needs the traces)."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        rows = compare_repo.list_sweeps(s, limit=500)
        counts = compare_repo.step_counts(s, [w.id for w in rows])
        sweeps = [
            {
                "id": w.id,
                "name": w.name,
                "mode": w.mode,
                "loads": list(w.loads or []),
                "status": w.status,
                "stop_reason": w.stop_reason,
                "created_at": w.created_at,
                "model": (w.spec or {}).get("model"),
                "steps": counts.get(w.id, 0),
            }
            for w in rows
        ]
    return render(request, "sweeps.html", {"nav": "sweeps", "sweeps": sweeps}, principal=principal)


@router.get("/sweeps/{sweep_id}")
async def sweep_page(request: Request, sweep_id: str) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    try:
        summ = await anyio.to_thread.run_sync(
            sweep_svc.sweep_summary, sessions_of(request), sweep_id
        )
    except NotFound:
        raise HTTPException(404, f"no sweep with id {sweep_id!r}") from None
    summ = json_safe(summ | {"label": summ.get("name") or summ["id"]})
    with session_scope(sessions_of(request)) as s:
        rows = {st["run_id"]: repo.get_run(s, st["run_id"]) for st in summ["steps"]}
        names = {rid: (row.name or rid) for rid, row in rows.items()}
        warnings = {rid: runs_view.run_warnings(row) for rid, row in rows.items()}
        live = sweep_live(s, sweep_id)
    return render(
        request,
        "sweep.html",
        {
            "nav": "sweeps",
            "sweep": summ,
            "names": names,
            "run_warnings": warnings,
            "figures": sweep_figures([summ]),
            "live": live,
            "can_run": principal is not None and principal.has("run"),
        },
        principal=principal,
    )
