"""The FastAPI application: ``create_app(settings)``.

Its lifespan migrates the database, opens the engine (``app.state.sessions``), gives active
leases one more TTL, runs the lost-lease sweeper every ``lease_ttl_s / 3``, revokes the
embedded worker token a killed server at this URL left and, unless ``settings.local_worker``
is off, starts an embedded worker with a fresh worker token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.api import (
    app_metrics,
    routes_compare,
    routes_interop,
    routes_jobs,
    routes_probes,
    routes_runs,
    routes_series,
    routes_sweeps,
    routes_tokens,
    routes_workers,
)
from app.api.auth_first import AuthFirst
from app.api.docs_ui import mount_docs
from app.api.hardening import harden
from app.api.schemas import Health
from app.protocol.wire import JobKind
from app.services import auth, series_alerts, sharded_sweeps, targets
from app.services import jobs as job_svc
from app.services.errors import ServiceError
from app.services.exports import ExportLimiter
from app.services.file_imports import ImportSlots
from app.services.secretbox import SecretBox
from app.settings import Settings
from app.storage.db import make_engine, session_factory, session_scope, upgrade_database
from app.web.errors import http_error, server_error
from app.web.mount import mount, static_assets

log = logging.getLogger(__name__)


async def _sweeper(sessions: sessionmaker[Session], every_s: float, wait_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            expired = await anyio.to_thread.run_sync(job_svc.expire_lost_leases, sessions)
            await anyio.to_thread.run_sync(sharded_sweeps.expire_waits, sessions, wait_s)
            await anyio.to_thread.run_sync(sharded_sweeps.advance_stalled, sessions)
            for e in expired:
                log.warning("lease of job %s expired: %s", e.job_id, e.outcome)
        except Exception:
            log.exception("lease sweep failed")


async def _alerter(app: FastAPI, every_s: float) -> None:
    """Series alerts off the request path: settle, judge, deliver (app.services.series_alerts)."""
    settings: Settings = app.state.settings
    while True:
        await asyncio.sleep(every_s)
        try:
            await anyio.to_thread.run_sync(
                series_alerts.process, app.state.sessions, settings, app.state.secretbox
            )
        except Exception:
            log.exception("series alert pass failed")


def local_worker_kinds(settings: Settings, *, torch_installed: bool) -> list[JobKind]:
    """The job kinds the embedded worker leases: loads and sweeps, and probes where torch is
    installed (one machine then runs probes out of the box) unless turned off."""
    kinds: list[JobKind] = ["bench", "sweep"]
    if settings.local_worker_probes and torch_installed:
        kinds.append("probe")
    return kinds


def _start_local_worker(app: FastAPI, settings: Settings) -> Any:
    """The embedded worker (app.worker.embedded), with a fresh worker-scope token."""
    from app.worker.capabilities import torch_version
    from app.worker.embedded import start_local_worker_process
    from app.worker.loop import WorkerOptions

    options = WorkerOptions(
        shutdown_grace_s=5.0,
        realtime=settings.local_worker_realtime,
        dataset_dirs=tuple(settings.dataset_dirs),
        allow_link_local=settings.target_allow_link_local,
    )
    kinds = local_worker_kinds(settings, torch_installed=torch_version() is not None)
    with session_scope(app.state.sessions) as s:
        row, secret = auth.create_local_worker_token(s, settings.server_url())
    app.state.local_worker_token_id = row.id
    return start_local_worker_process(settings.server_url(), secret, options=options, kinds=kinds)


def _revoke_local_token(app: FastAPI) -> None:
    token_id = getattr(app.state, "local_worker_token_id", None)
    if token_id is not None:
        with session_scope(app.state.sessions) as s:
            auth.revoke_token(s, token_id)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    url = settings.database_url
    await anyio.to_thread.run_sync(upgrade_database, url)
    backend = make_url(url).get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False}
    if ":memory:" not in url:  # pool sizing: docs/reliability.md
        kwargs.update(
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            pool_timeout=settings.db_pool_timeout_s,
        )
    engine = make_engine(url, echo=settings.sql_echo, **kwargs)
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.state.lease_lock = job_svc.new_lease_lock(backend)
    moved = job_svc.extend_leases(app.state.sessions, ttl_s=settings.lease_ttl_s)
    if moved:
        log.info("gave %d active lease(s) one more TTL after the restart", moved)
    sweeper = asyncio.create_task(
        _sweeper(app.state.sessions, settings.lease_ttl_s / 3, settings.shard_wait_s)
    )
    alerter = asyncio.create_task(_alerter(app, settings.alert_poll_s))
    with session_scope(app.state.sessions) as s:  # a killed server's embedded worker token
        stale = auth.revoke_local_worker_tokens(s, settings.server_url())
    if stale:
        log.warning("revoked the embedded worker token(s) %s a killed server left", stale)
    worker = _start_local_worker(app, settings) if settings.local_worker else None
    try:
        yield
    finally:
        if worker is not None:
            await anyio.to_thread.run_sync(worker.stop)
        for task in (sweeper, alerter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        _revoke_local_token(app)
        engine.dispose()


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    if exc.loc is not None:  # shaped like FastAPI's own 422 so clients parse one format
        body: Any = [{"loc": list(exc.loc), "msg": exc.detail, "type": "value_error"}]
    else:
        body = exc.detail
    headers = {"Retry-After": "5"} if exc.status_code == 429 else None
    return JSONResponse({"detail": body}, status_code=exc.status_code, headers=headers)


EXPORT_PATH = re.compile(
    r"^/(api/v1/runs/[^/]+/export/[^/]+|runs/[^/]+/(requests|events)\.(csv|json|jsonl|parquet))$"
)


class CompressPages:
    """gzip (level 6) for pages and API answers; not for exports, which stream at the
    database's pace and would spend the server's CPU compressing hundreds of MB (Parquet
    is compressed already)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=1024, compresslevel=6)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and EXPORT_PATH.match(scope.get("path", "")):
            await self.app(scope, receive, send)
        else:
            await self.gzip(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The tokentrace server. ``settings`` default: ``Settings()`` from the environment."""
    app = FastAPI(
        title="tokentrace",
        version=__version__,
        description="Benchmark runs, jobs and workers. Writes need a bearer token "
        "(docs/api.md); the worker protocol is described in app/protocol/wire.py.",
        lifespan=lifespan,
        docs_url=None,  # served from local files instead (app.api.docs_ui)
        redoc_url=None,  # ReDoc loads from a CDN: not offered
    )
    mount_docs(app, init_js=static_assets(app).url("swagger-init.js"))
    app.state.settings = settings or Settings()
    app.state.secretbox = SecretBox.from_settings(app.state.settings)
    app.state.export_limiter = ExportLimiter()
    app.state.auth_limiter = auth.FailureLimiter(
        max_failures=app.state.settings.auth_max_failures,
        window_s=app.state.settings.auth_failure_window_s,
        max_clients=app.state.settings.auth_failure_clients,
    )
    app.state.import_slots = ImportSlots(app.state.settings.max_concurrent_imports)
    targets.parse_rules(app.state.settings.target_allowlist)  # a bad entry fails at start
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(HTTPException, http_error)  # HTML for pages (app.web.errors)
    app.add_exception_handler(Exception, server_error)  # the 500: HTML page or JSON
    for module in (routes_runs, routes_jobs, routes_workers, routes_tokens):
        app.include_router(module.router)
    app.include_router(routes_probes.router)
    app.include_router(routes_compare.router)
    app.include_router(routes_sweeps.router)  # sweeps on workers
    app.include_router(routes_series.router)  # named series, trends, alerts, the gate
    app.include_router(routes_interop.router)  # imports, exports, server metrics
    app_metrics.install(app)  # /metrics (own registry) and /readyz

    @app.get("/healthz", tags=["health"])
    def healthz(request: Request) -> Health:
        backend = make_url(request.app.state.settings.database_url).get_backend_name()
        return Health(status="ok", version=__version__, database=backend)

    app.add_middleware(CompressPages)  # type: ignore[arg-type]
    app.add_middleware(AuthFirst)  # type: ignore[arg-type]  # a token before any body
    harden(app, app.state.settings)  # body limits, security headers, CORS, DB loss -> 503
    mount(app)
    return app
