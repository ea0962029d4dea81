"""The target's /metrics as a running run's page follows them: each heartbeat's
``server_metrics`` (``wire.JobProgress``; role -> value at one scrape) appended to a
bounded history of the job (``app.storage.live``): times (s in the run) and, per role,
values. Counters (``live_metrics.COUNTER_ROLES``) are shown as their
per-second rate between consecutive scrapes. At most ``MAX_POINTS`` points: past that,
every other one of the older half is dropped (the recent ones stay dense). A sweep's
history starts again at each step (its ``run_id``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.protocol.live_metrics import COUNTER_ROLES, LIVE_ROLES
from app.storage import live as live_repo

MAX_POINTS = 600


def record(session: Session, job_id: str, progress: dict[str, Any]) -> None:
    """Append a heartbeat's scrape (its progress' ``server_metrics``) to the job's history."""
    snap = progress.get("server_metrics")
    t = progress.get("server_metrics_t_s")
    if not (isinstance(snap, dict) and snap and isinstance(t, int | float)):
        return
    old = live_repo.get(session, job_id)
    run_id = progress.get("run_id")
    hist: dict[str, Any] = (
        old if isinstance(old, dict) and old.get("run_id") == run_id
        else {"run_id": run_id, "t_s": [], "values": {}}
    )  # fmt: skip
    times = hist["t_s"]
    if times and t <= times[-1]:  # the same scrape twice: kept once
        return
    times.append(float(t))
    for role in LIVE_ROLES:
        col = hist["values"].setdefault(role, [None] * (len(times) - 1))
        v = snap.get(role)
        col.append(float(v) if isinstance(v, int | float) else None)
    _thin(hist)
    live_repo.put(session, job_id, hist)


def _thin(hist: dict[str, Any]) -> None:
    n = len(hist["t_s"])
    if n <= MAX_POINTS:
        return
    half = n // 2
    keep = list(range(0, half, 2)) + list(range(half, n))
    hist["t_s"] = [hist["t_s"][i] for i in keep]
    hist["values"] = {k: [v[i] for i in keep] for k, v in hist["values"].items()}


def series(session: Session, job_id: str | None) -> dict[str, Any]:
    """The job's history as the page draws it: times, gauges as they are, counters as
    rates (per s, between consecutive scrapes; a drop, a reset, gives no point)."""
    hist = live_repo.get(session, job_id) if job_id is not None else None
    if not isinstance(hist, dict):
        return {"t_s": [], "gauges": {}, "rates": {}}
    t = [float(x) for x in hist.get("t_s") or []]
    values = hist.get("values") or {}
    gauges = {
        role: values[role]
        for role in LIVE_ROLES
        if role not in COUNTER_ROLES and any(v is not None for v in values.get(role) or [])
    }
    rates: dict[str, list[float | None]] = {}
    for role in LIVE_ROLES:
        col = values.get(role) or []
        if role not in COUNTER_ROLES or not any(v is not None for v in col):
            continue
        out: list[float | None] = [None]
        for i in range(1, len(t)):
            a, b, dt = col[i - 1], col[i], t[i] - t[i - 1]
            ok = a is not None and b is not None and dt > 0 and b >= a
            out.append((b - a) / dt if ok else None)
        rates[f"{role}_per_s"] = out
    return {"t_s": t, "gauges": gauges, "rates": rates}
