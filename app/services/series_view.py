"""What a series shows (its page, ``GET /api/v1/series/{name}``, ``tokentrace series
show``): the series, its runs, the trend of one metric with change points, its current
verdict, and its alerts with their deliveries. Reads no run summary."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.services import series as series_svc
from app.services import series_alerts
from app.storage.db import session_scope


def detail(
    sessions: sessionmaker[Session],
    name: str,
    metric: str | None = None,
    track: str | None = None,
    *,
    limit: int = series_svc.SHOW_LIMIT,
) -> tuple[series_svc.SeriesView, dict[str, Any]]:
    """The series' view and its JSON-ready description."""
    view = series_svc.load_view(
        sessions, name, series_svc.parse_ref(metric), track=track, limit=limit
    )
    with session_scope(sessions) as s:
        alerts = series_alerts.rules(s, name)
    out = view.series | {
        "runs": [series_svc.member_dict(m) for m in view.members],
        "tracks": view.tracks,
        "trend": view.trend.to_dict(),
        "verdict": series_svc.latest_verdict(view),
        **alerts,
    }
    return view, out
