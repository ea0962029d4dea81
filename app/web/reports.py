"""Downloads of the single-file reports (``app.web.report_html``): a run's
(/runs/{id}/report.html) and a comparison's (/compare/report.html?ids=A&ids=B, the first
the baseline). A run still running is refused with 409 naming its state."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import Response

from app.services.errors import ServiceError
from app.web import report_html
from app.web.context import read_gate, sessions_of

router = APIRouter(include_in_schema=False)


def _download(text: str, name: str) -> Response:
    return Response(
        text,
        media_type="text/html; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.get("/runs/{run_id}/report.html")
async def run_report_file(
    request: Request, run_id: Annotated[str, Path(max_length=64)]
) -> Response:
    _principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    try:
        text = await anyio.to_thread.run_sync(
            lambda: report_html.run_report(sessions_of(request), run_id)
        )
    except ServiceError as e:
        raise HTTPException(e.status_code, e.detail) from None
    return _download(text, report_html.filename("run", run_id))


@router.get("/compare/report.html")
async def compare_report_file(
    request: Request, ids: Annotated[list[str] | None, Query(max_length=12)] = None
) -> Response:
    _principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    wanted = [i.strip() for raw in ids or [] for i in raw.split(",") if i.strip()]
    try:
        text = await anyio.to_thread.run_sync(
            lambda: report_html.compare_report(sessions_of(request), wanted)
        )
    except ServiceError as e:
        raise HTTPException(e.status_code, e.detail) from None
    return _download(text, report_html.filename("compare", "-".join(wanted[:2])))
