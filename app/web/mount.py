"""Integration point: ``mount(app)`` adds the dashboard pages and ``/static`` to an app."""

from __future__ import annotations

from fastapi import FastAPI

from app.web import (
    compare,
    interop,
    launch,
    probes,
    probes_launch,
    reports,
    runs,
    runs_actions,
    runs_exports,
    runs_live,
    series,
    sweeps,
    sweeps_actions,
    sweeps_launch,
    workers,
)
from app.web.assets import HashedStaticFiles, StaticAssets
from app.web.context import asset_dir


def static_assets(app: FastAPI) -> StaticAssets:
    """The app's static files with their hashes, scanned once (``app.state.static_assets``)."""
    assets = getattr(app.state, "static_assets", None)
    if not isinstance(assets, StaticAssets):
        assets = StaticAssets.scan(asset_dir("static"))
        app.state.static_assets = assets
    return assets


def mount(app: FastAPI) -> None:
    """Include the pages routers and serve ``static/`` (plotly.js, CSS, JS) at /static,
    under content-hashed URLs (app.web.assets).

    Needs ``app.state.sessions`` (set by ``create_app``'s lifespan) at request time.
    """
    if any(getattr(r, "path", None) == "/static" for r in app.routes):
        return
    app.include_router(reports.router)  # single-file HTML reports (before /compare, /runs)
    app.include_router(compare.router)  # /compare: runs or sweeps side by side
    app.include_router(series.router)  # named series: trends, change points, alerts
    app.include_router(sweeps.router)  # the sweeps list and a sweep's page
    app.include_router(runs.router)  # the runs list, a run, its requests
    app.include_router(runs_exports.router)
    app.include_router(runs_actions.router)  # a run's forms: tags, note, baseline, cancel
    app.include_router(runs_live.router)  # a running run's live figures
    app.include_router(launch.router)
    app.include_router(sweeps_launch.router)  # sweep form, live sweep state, cancel
    app.include_router(sweeps_actions.router)  # a sweep's forms: tags, note, baseline, delete
    app.include_router(probes.router)
    app.include_router(probes_launch.router)  # probe form
    app.include_router(workers.router)  # workers and the queue
    app.include_router(interop.router)  # import page, more exports
    app.mount("/static", HashedStaticFiles(static_assets(app)), name="static")
