"""The sweeps list and a sweep's page (its steps, curves, live state, goodput SLOs and the
forms of ``sweeps_actions``); launching one is ``sweeps_launch``, comparing two is
``compare``."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from app.analysis.metric_defs import OUTPUT_THROUGHPUT
from app.services import sweeps as sweep_svc
from app.services.auth import Principal
from app.services.errors import NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import runs_view
from app.web.compare import sweep_figure_keys, sweep_figures, sweep_steps_columns
from app.web.context import read_gate, render, sessions_of
from app.web.pickers import valid_id
from app.web.sweeps_launch import sweep_live

router = APIRouter(include_in_schema=False)

# what a successful sweep action says on the page it redirects to (``?done=KEY``)
DONE_TEXT = {
    "tags": "Tags saved.",
    "note": "Note saved.",
    "baseline": "Baseline saved.",
    "pinned": "Baseline pinned.",
    "unpinned": "Baseline unpinned.",
}
MAX_LISTED = 500  # sweeps on the list page


@router.get("/sweeps")
def sweeps_page(request: Request, tag: str | None = None) -> Response:
    """Every sweep, newest first (max goodput is on each sweep's page: it needs the traces);
    ``tag``: only the sweeps with that tag."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    wanted = (tag or "").strip() or None
    with session_scope(sessions_of(request)) as s:
        rows = compare_repo.list_sweeps(s, limit=MAX_LISTED)
        if wanted is not None:
            rows = [w for w in rows if wanted in (w.tags or [])]
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
                "tags": list(w.tags or []),
            }
            for w in rows
        ]
    return render(
        request,
        "sweeps.html",
        {
            "nav": "sweeps",
            "sweeps": sweeps,
            "tag": wanted,
            "deleted": request.query_params.get("deleted"),
        },
        principal=principal,
    )


def baselines_of_sweep(s: Any, sweep_id: str) -> list[dict[str, Any]]:
    """The current baseline versions that point at this sweep, by name."""
    return [
        {"name": b.name, "version": b.version, "pinned": b.pinned}
        for b in compare_repo.list_baselines(s)
        if b.sweep_id == sweep_id
    ]


async def render_sweep_page(
    request: Request,
    sweep_id: str,
    *,
    principal: Principal | None,
    errors: dict[str, str] | None = None,
    values: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    """The sweep page (404 when there is no such sweep). The query's goodput SLOs
    (``slo_ttft``/``slo_tpot``/``slo_e2el``, ms) replace the sweep's own for max goodput;
    a bad one is named beside its field (422). ``errors``/``values``: a refused action
    form's messages and what was typed."""
    if not valid_id(sweep_id):
        raise HTTPException(404, f"no sweep with id {sweep_id[:40]!r}")
    query = dict(request.query_params.items())
    slos, slo_errors = runs_view.parse_slos(query)
    try:
        summ = await anyio.to_thread.run_sync(
            lambda: sweep_svc.sweep_summary(
                sessions_of(request), sweep_id, slos_ms=slos, steady=query.get("steady") == "1"
            )
        )
    except NotFound:
        raise HTTPException(404, f"no sweep with id {sweep_id!r}") from None
    summ = json_safe(summ | {"label": summ.get("name") or summ["id"]})
    with session_scope(sessions_of(request)) as s:
        rows = {st["run_id"]: repo.get_run(s, st["run_id"]) for st in summ["steps"]}
        names = {rid: (row.name or rid) for rid, row in rows.items()}
        warnings = {rid: runs_view.run_warnings(row) for rid, row in rows.items()}
        live = sweep_live(s, sweep_id)
        baselines = baselines_of_sweep(s, sweep_id)
    shown = {
        "tags": ", ".join(summ.get("tags") or []),
        "note": str(summ.get("note") or ""),
        "baseline_name": "",
    } | (values or {})
    can_run = principal is not None and principal.has("run")
    if slo_errors and status_code == 200:
        status_code = 422
    return render(
        request,
        "sweep.html",
        {
            "nav": "sweeps",
            "sweep": summ,
            "names": names,
            "run_warnings": warnings,
            "figures": sweep_figures([summ]),
            "figure_keys": sweep_figure_keys(),
            "step_columns": sweep_steps_columns(),
            "tput_key": OUTPUT_THROUGHPUT.key,
            "live": live,
            "can_run": can_run,
            "can_act": can_run,
            "slo_fields": runs_view.slo_fields(),
            "slos": summ.get("slos_ms") or {},
            "slo_query": {k: v for k, v in query.items() if k.startswith("slo_")},
            "slo_errors": slo_errors,
            "action_errors": errors or {},
            "action_values": shown,
            "done": DONE_TEXT.get(query.get("done") or ""),
            "sweep_baselines": baselines,
        },
        principal=principal,
        status_code=status_code,
    )


@router.get("/sweeps/{sweep_id}")
async def sweep_page(request: Request, sweep_id: str) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    return await render_sweep_page(request, sweep_id, principal=principal)
