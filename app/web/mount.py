"""Integration point: ``mount(app)`` adds the dashboard pages and ``/static`` to an app."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.web import (
    exports,
    interop_pages,
    launch,
    pages,
    pages_compare,
    pages_probes,
    probe_launch,
    sweep_pages,
)
from app.web.context import asset_dir


def mount(app: FastAPI) -> None:
    """Include the pages routers and serve ``static/`` (plotly.js, CSS, JS) at /static.

    Needs ``app.state.sessions`` (set by ``create_app``'s lifespan) at request time.
    """
    if any(getattr(r, "path", None) == "/static" for r in app.routes):
        return
    app.include_router(pages_compare.router)  # before pages: owns /compare
    app.include_router(pages.router)
    app.include_router(exports.router)
    app.include_router(launch.router)
    app.include_router(pages_probes.router)
    app.include_router(sweep_pages.router)  # sweep form, live sweep state, cancel
    app.include_router(probe_launch.router)  # probe form
    app.include_router(interop_pages.router)  # import page, more exports
    app.mount("/static", StaticFiles(directory=str(asset_dir("static"))), name="static")
