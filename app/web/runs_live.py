"""The live run panel: latency percentiles and throughput of the requests stored so far
(``GET /runs/{id}/live.json``, polled by static/app.js while the run is active), and the
panel's header: its heading, progress bar and count, the page's "started" time and request
count, all from the server's stored state in the same answer (``live_progress``), so the
bar, the count and the header never disagree; with ``?series=1`` the live panels' time
series (static/live-panels.js).

Read from per-request summary columns only (``app.storage.request_table.live_columns``):
no event is decoded, so a poll costs one column read whatever the run's length."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from app.analysis.live_windows import windowed_percentiles
from app.analysis.metric_defs import Metric, shown
from app.analysis.percentiles import percentiles
from app.figures import series as fs
from app.protocol.wire import TERMINAL_JOB_STATES
from app.services import live_series
from app.services.job_rules import planned_of
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage import request_table
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.storage.models import Job, Run
from app.web.context import principal_of, reads_allowed, sessions_of

router = APIRouter(include_in_schema=False)

LIVE_PCTS = (50.0, 90.0, 99.0)


def live_metrics() -> list[Metric]:
    """The metrics the live panel shows (``Metric.views`` "live": TTFT, TPOT, E2E), each
    keyed in ``live.json`` by its column's name ("ttft", "tpot", "e2e")."""
    return shown("live")


def live_figures(cols: request_table.LiveColumns) -> dict[str, Any]:
    """Counts, p50/p90/p99 of each live metric (ms, successful requests, linear
    interpolation as everywhere) and throughput over the window so far: first send of any
    stored request .. last stored request end. None where there is nothing to measure."""
    ok = cols.ok
    n = int(ok.shape[0])
    cut = int(cols.cancelled.sum()) if cols.cancelled is not None else 0
    out: dict[str, Any] = {
        "stored": n,
        "ok": int(ok.sum()),
        "failed": n - int(ok.sum()) - cut,  # errors and timeouts
        "cancelled": cut,  # cut by the client: no error
    }
    for m in live_metrics():
        key = m.column_name
        values = cols.values[key][ok] / m.per_unit
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
    """Each live metric's p50/p90/p99 (ms) per window of request end time
    (``app.analysis.live_windows``): the live panels' latency lines."""
    end_s = np.where(cols.end_ns >= 0, cols.end_ns / 1e9, np.nan)
    return {
        m.column_name: windowed_percentiles(end_s, cols.values[m.column_name] / m.per_unit, cols.ok)
        for m in live_metrics()
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
    for m in live_metrics():
        key = m.column_name
        w = latency[key]
        lines = {p: w[p] for p in (f"p{int(q)}" for q in LIVE_PCTS)} if w["t_s"] else {}
        out[f"latency_{key}"] = fs.live_figure(f"{m.name} over the run", m.unit, w["t_s"], lines)
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


HEADINGS = {"queued": "Queued", "leased": "Starting", "running": "Running"}
STATE_TEXT = {"queued": "queued", "leased": "starting", "running": "running"}


def live_progress(
    run_status: str, job_state: str | None, planned: int | None, stored: int
) -> dict[str, Any]:
    """The live panel's heading, progress bar and its label from one snapshot: the run's
    status, its job's state and the measured requests planned and stored so far. The bar is
    ``stored / planned``, the label says the same count ("running: 113 of 300 requests
    stored"); a queued run is headed "Queued" (its job not yet taken), a leased one
    "Starting". ``ended``: the job (else the run) is no longer active."""
    active_job = job_state is not None and job_state not in TERMINAL_JOB_STATES
    state = job_state if active_job and job_state is not None else run_status
    ended = state not in HEADINGS
    word = STATE_TEXT.get(state, state)
    if planned:
        percent: float | None = min(100.0, 100.0 * stored / planned)
        count = f"{stored} of {planned} requests stored"
    else:
        percent = None
        count = f"{stored} requests stored"
    return {
        "state": state,
        "heading": HEADINGS.get(state, "Ended"),
        "state_text": word,
        "planned": planned,
        "stored": stored,
        "percent": percent,
        "text": word if state == "queued" and not stored else f"{word}: {count}",
        "ended": ended,
    }


def measured_planned(run: Run, job: Job | None) -> int | None:
    """The measured requests the run plans: its spec's, or (multi-turn sessions, a whole
    trace) what its worker reported; None while unknown."""
    spec = dict(run.spec or {})
    progress = job.progress if job is not None and isinstance(job.progress, dict) else {}
    mine = progress.get("run_id") in (None, run.id)  # a sweep job's progress is its step's
    total = planned_of(spec, progress.get("planned") if mine else None)
    if total is None:
        return None
    return max(0, total - int(spec.get("warmup_requests") or 0)) or None


def iso_utc(v: Any) -> str | None:
    """A stored time as ISO 8601 UTC ("...Z"), None for none."""
    if v is None:
        return None
    t = v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)
    return str(t.strftime("%Y-%m-%dT%H:%M:%SZ"))


def started_at(run: Run, job: Job | None) -> Any:
    """When the run started, as the server stored it: the run's own time, else its job's
    (set at the job's first heartbeat); None while queued."""
    if run.started_at is not None:
        return run.started_at
    return job.started_at if job is not None else None


@router.get("/runs/{run_id}/live.json")
def run_live(request: Request, run_id: str) -> JSONResponse:
    """The run's status, ``live_progress`` and ``live_figures`` of its requests stored so
    far, with its start time: one snapshot of the server's stored state; with ``series=1``
    also the live panels' time series: its latency percentiles by window (``latency``) and
    the target's /metrics its job's heartbeats carried (``server``)."""
    if not reads_allowed(request, principal_of(request)):
        raise HTTPException(401, "sign in to read runs")
    with_series = request.query_params.get("series") == "1"
    with session_scope(sessions_of(request)) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise HTTPException(404, f"no run with id {run_id!r}")
        status = str(row.status)
        job = job_repo.job_for_run(s, run_id)
        cols = request_table.live_columns(s, run_id)
        figures = live_figures(cols)
        progress = live_progress(
            status, job.state if job else None, measured_planned(row, job), figures["stored"]
        )
        started = iso_utc(started_at(row, job))
        extra: dict[str, Any] = {}
        if with_series:
            extra["server"] = live_series.series(s, job.id if job is not None else None)
    if with_series:
        extra["latency"] = live_time_series(cols)
        extra["panels"] = json_safe(live_panels(extra["latency"], extra["server"]))
    body = {"run_id": run_id, "status": status, "started_at": started, "progress": progress}
    return JSONResponse(body | figures | extra)
