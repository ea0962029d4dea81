"""The live run panel: latency percentiles and throughput of the requests stored so far
(``GET /runs/{id}/live.json``, polled by static/app.js while the run is active).

Read from per-request summary columns only (``app.storage.request_table.live_columns``):
no event is decoded, so a poll costs one column read whatever the run's length."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from app.analysis.percentiles import percentiles
from app.storage import repository as repo
from app.storage import request_table
from app.storage.db import session_scope
from app.web.context import principal_of, reads_allowed, sessions_of

router = APIRouter(include_in_schema=False)

LIVE_PCTS = (50.0, 90.0, 99.0)
LIVE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))


def live_figures(cols: request_table.LiveColumns) -> dict[str, Any]:
    """Counts, p50/p90/p99 of TTFT, TPOT and E2E (ms, successful requests, linear
    interpolation as everywhere) and throughput over the window so far: first send of any
    stored request .. last stored request end. None where there is nothing to measure."""
    ok = cols.ok
    n = int(ok.shape[0])
    out: dict[str, Any] = {"stored": n, "ok": int(ok.sum()), "failed": n - int(ok.sum())}
    for key, _label in LIVE_METRICS:
        values = getattr(cols, f"{key}_ns")[ok] / 1e6
        got = percentiles(values, LIVE_PCTS)
        out[key] = {f"p{int(p)}": got[p] for p in LIVE_PCTS}
        out[key]["count"] = int(np.isfinite(values).sum())
    sent = cols.sent_ns[cols.sent_ns >= 0]
    ends = cols.end_ns[cols.end_ns >= 0]
    window_s = (int(ends.max()) - int(sent.min())) / 1e9 if sent.size and ends.size else 0.0
    out["window_s"] = window_s if window_s > 0 else None
    if window_s > 0:
        toks = cols.output_tokens[ok]
        out["req_per_s"] = int(ok.sum()) / window_s
        out["output_tok_per_s"] = int(toks[toks >= 0].sum()) / window_s
    else:
        out["req_per_s"] = None
        out["output_tok_per_s"] = None
    return out


@router.get("/runs/{run_id}/live.json")
def run_live(request: Request, run_id: str) -> JSONResponse:
    """The run's status and ``live_figures`` of its requests stored so far."""
    if not reads_allowed(request, principal_of(request)):
        raise HTTPException(401, "sign in to read runs")
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        status = str(row.status)
        cols = request_table.live_columns(s, run_id)
    return JSONResponse({"run_id": run_id, "status": status} | live_figures(cols))
