"""Integration point: ``mount(app)`` adds the dashboard pages and ``/static`` to an app."""

from __future__ import annotations

from fastapi import FastAPI

from app.web import (
    exports,
    interop_pages,
    launch,
    live,
    pages,
    pages_compare,
    pages_probes,
    probe_launch,
    run_actions,
    sweep_pages,
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
    app.include_router(pages_compare.router)  # before pages: owns /compare
    app.include_router(pages.router)
    app.include_router(exports.router)
    app.include_router(launch.router)
    app.include_router(run_actions.router)  # run page forms (issue 17)
    app.include_router(live.router)  # live run figures (issue 17)
    app.include_router(pages_probes.router)
    app.include_router(sweep_pages.router)  # sweep form, live sweep state, cancel
    app.include_router(probe_launch.router)  # probe form
    app.include_router(interop_pages.router)  # import page, more exports
    app.mount("/static", HashedStaticFiles(static_assets(app)), name="static")
