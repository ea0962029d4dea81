"""The live run panel: latency percentiles and throughput of the requests stored so far
(``GET /runs/{id}/live.json``, polled by static/app.js while the run is active), and with
``?series=1`` the live panels' time series (static/live-panels.js).

Read from per-request summary columns only (``app.storage.request_table.live_columns``):
no event is decoded, so a poll costs one column read whatever the run's length."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from app.analysis.live_windows import windowed_percentiles
from app.analysis.percentiles import percentiles
from app.figures import series as fs
from app.services import live_series
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import request_table
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
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


def live_time_series(cols: request_table.LiveColumns) -> dict[str, Any]:
    """TTFT, TPOT and E2E p50/p90/p99 (ms) per window of request end time
    (``app.analysis.live_windows``): the live panels' latency lines."""
    end_s = np.where(cols.end_ns >= 0, cols.end_ns / 1e9, np.nan)
    return {
        key: windowed_percentiles(end_s, getattr(cols, f"{key}_ns") / 1e6, cols.ok)
        for key, _label in LIVE_METRICS
    }


SERVER_NAMES = {
    "running": "requests running",
    "waiting": "requests waiting",
    "kv_cache_usage": "KV-cache usage",
    "prompt_tokens_per_s": "prompt tokens/s",
    "generation_tokens_per_s": "generation tokens/s",
}


def live_panels(latency: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    """The live panels' figures (``app.figures.series.live_figure``): each latency's
    p50/p90/p99 by window, and the target's queue, KV-cache use and token rates."""
    out: dict[str, Any] = {}
    for key, label in LIVE_METRICS:
        w = latency[key]
        lines = {p: w[p] for p in (f"p{int(q)}" for q in LIVE_PCTS)} if w["t_s"] else {}
        out[f"latency_{key}"] = fs.live_figure(f"{label} over the run", "ms", w["t_s"], lines)
    t = server["t_s"]
    groups = {
        "server_queue": ("target: requests", "requests", ("running", "waiting"), "gauges"),
        "server_kv": ("target: KV-cache usage", "fraction", ("kv_cache_usage",), "gauges"),
        "server_tokens": (
            "target: tokens/s",
            "tokens/s",
            ("prompt_tokens_per_s", "generation_tokens_per_s"),
            "rates",
        ),
    }
    for key, (title, unit, roles, kind) in groups.items():
        lines = {SERVER_NAMES[r]: server[kind][r] for r in roles if r in server[kind]}
        out[key] = fs.live_figure(title, unit, t, lines)
    return out


@router.get("/runs/{run_id}/live.json")
def run_live(request: Request, run_id: str) -> JSONResponse:
    """The run's status and ``live_figures`` of its requests stored so far; with
    ``series=1`` also the live panels' time series: its latency percentiles by window
    (``latency``) and the target's /metrics its job's heartbeats carried (``server``)."""
    if not reads_allowed(request, principal_of(request)):
        raise HTTPException(401, "sign in to read runs")
    with_series = request.query_params.get("series") == "1"
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        status = str(row.status)
        cols = request_table.live_columns(s, run_id)
        extra: dict[str, Any] = {}
        if with_series:
            job = job_repo.job_for_run(s, run_id)
            extra["server"] = live_series.series(s, job.id if job is not None else None)
    if with_series:
        extra["latency"] = live_time_series(cols)
        extra["panels"] = json_safe(live_panels(extra["latency"], extra["server"]))
    return JSONResponse({"run_id": run_id, "status": status} | live_figures(cols) | extra)
