"""``/docs``: Swagger UI from the files the ``fastapi-offline`` package ships (works
offline; OpenAPI 3.1), started by a static script, so the page keeps the strict
Content-Security-Policy (no inline script). Only its files are used, not its app class."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/api-docs/assets"  # the package's files
DOCS_PATHS = ("/docs", ASSETS)

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tokentrace API</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" href="{assets}/favicon.png">
</head>
<body data-openapi="{openapi}">
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{init_js}"></script>
</body>
</html>
"""


def mount_docs(app: FastAPI, *, init_js: str = "/static/swagger-init.js") -> None:
    """Serve Swagger UI's files and the ``/docs`` page (create the app with docs_url=None);
    ``init_js``: the URL of static/swagger-init.js (its hashed URL, app.web.assets)."""
    import fastapi_offline

    files = Path(fastapi_offline.__file__).parent / "static"
    app.mount(ASSETS, StaticFiles(directory=files), name="api-docs")
    html = PAGE.format(assets=ASSETS, openapi=app.openapi_url or "/openapi.json", init_js=init_js)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(html)
