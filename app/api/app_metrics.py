"""tokentrace's own ``/metrics`` (Prometheus text) and ``/readyz``.

Each app owns its ``CollectorRegistry`` (nothing goes to prometheus_client's global default
registry, so test apps never share state). Exposed:

- ``tokentrace_http_request_duration_seconds{method,route,status}``: API/page latencies by
  route template (``unmatched`` for paths no route serves) and method (one of
  ``METHODS``, any other ``other``), so clients cannot grow the label set;
- ``tokentrace_ingest_batches_total`` / ``tokentrace_ingest_bytes_total``: result batches
  workers uploaded (rate() gives the ingest rate);
- ``tokentrace_jobs{state}``, ``tokentrace_workers{state}`` (registered, busy, seen within
  three heartbeats), read from the database at scrape time. When the database cannot be
  read, ``tokentrace_database_up`` is 0 and those gauges are left out (no made-up zeros).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable, Iterator

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.exc import SQLAlchemyError

from app.storage.models import Job, JobBatch, Worker

JOB_STATES = ("queued", "leased", "running", "succeeded", "failed", "cancelled")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    """The method as a label value: a standard one as is, anything else ``other``."""
    return method if method in METHODS else "other"


RESULTS_ROUTE = "/api/v1/jobs/{job_id}/results"


class _StateCollector(Collector):
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("tokentrace_database_up", "1 when the database answered")
        sessions = getattr(self.app.state, "sessions", None)
        if sessions is None:
            up.add_metric([], 0)
            yield up
            return
        settings = self.app.state.settings
        recent = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3 * settings.heartbeat_interval_s)
        try:
            with sessions() as s:
                jobs = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
                total = int(s.scalar(select(func.count()).select_from(Worker)) or 0)
                busy = int(
                    s.scalar(
                        select(func.count())
                        .select_from(Worker)
                        .where(Worker.current_job_id.is_not(None))
                    )
                    or 0
                )
                seen = int(
                    s.scalar(
                        select(func.count())
                        .select_from(Worker)
                        .where(Worker.last_seen_at >= recent)
                    )
                    or 0
                )
                stored = int(s.scalar(select(func.coalesce(func.sum(JobBatch.n_requests), 0))) or 0)
        except SQLAlchemyError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        g = GaugeMetricFamily("tokentrace_jobs", "jobs by state", labels=["state"])
        for state in sorted(set(JOB_STATES) | set(jobs)):
            g.add_metric([state], int(jobs.get(state, 0)))
        yield g
        w = GaugeMetricFamily("tokentrace_workers", "workers", labels=["state"])
        w.add_metric(["registered"], total)
        w.add_metric(["busy"], busy)
        w.add_metric(["seen_recently"], seen)
        yield w
        yield GaugeMetricFamily(
            "tokentrace_uploaded_requests",
            "requests stored from worker uploads (of jobs still in the database)",
            value=stored,
        )


class Telemetry:
    def __init__(self, app: FastAPI) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "tokentrace_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.ingest_batches = Counter(
            "tokentrace_ingest_batches",
            "result batches uploaded by workers",
            registry=self.registry,
        )
        self.ingest_bytes = Counter(
            "tokentrace_ingest_bytes", "bytes of result batches uploaded", registry=self.registry
        )
        self.registry.register(_StateCollector(app))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def install(app: FastAPI) -> Telemetry:
    """Add the timing middleware, ``GET /metrics`` and ``GET /readyz`` to ``app``."""
    tel = Telemetry(app)
    app.state.telemetry = tel

    @app.middleware("http")
    async def _time(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        if template.startswith("/static"):
            return response
        method = method_label(request.method)
        tel.latency.labels(method, template, str(response.status_code)).observe(
            time.perf_counter() - start
        )
        if template == RESULTS_ROUTE and request.method == "POST" and response.status_code < 300:
            tel.ingest_batches.inc()
            tel.ingest_bytes.inc(int(request.headers.get("content-length") or 0))
        return response

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(tel.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/readyz", tags=["health"])
    def readyz(request: Request) -> JSONResponse:
        """200 when the database answers (migrations ran at start); 503 otherwise."""
        sessions = getattr(request.app.state, "sessions", None)
        if sessions is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            with sessions() as s:
                s.execute(text("SELECT 1"))
        except SQLAlchemyError as e:
            return JSONResponse(
                {"status": "database unavailable", "error": type(e).__name__}, status_code=503
            )
        return JSONResponse({"status": "ready"})

    return tel
