"""Store the target's /metrics series of a run (scraped beside the load by
``app.client.metrics_scraper``)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.protocol.prometheus import Series
from app.protocol.wire import ServerMetricSeries
from app.services.errors import Invalid
from app.storage import interop as interop_repo


def store(session: Session, run_id: str, series: list[Series]) -> int:
    return interop_repo.replace_server_metrics(session, run_id, series)


def store_wire(session: Session, run_id: str, series: list[ServerMetricSeries]) -> int:
    """Store series a worker sent with its completion (a ``Invalid`` names a bad one)."""
    out: list[Series] = []
    for i, s in enumerate(series):
        if len(s.t_ns) != len(s.values):
            raise Invalid(f"server_metrics[{i}]: t_ns and values differ in length")
        out.append(Series(s.name, dict(s.labels), s.kind, list(s.t_ns), list(s.values)))
    return store(session, run_id, out)
