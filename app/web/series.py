"""The series pages: every series (/series) and one series (/series/{name}): the trend of
a chosen metric with each run's interval, change points marked (click a point: its run),
the comparability fields that changed at each change point, the current verdict, the
runs (flagged, refused and untrusted ones said so) and the alerts with their deliveries.
Read from the series' stored points (``app.services.series_view``): no run summary."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import Response

from app.analysis import series as sa
from app.analysis.comparability import KEY_FIELDS
from app.figures import series as fs
from app.figures.scriptjson import plotly_json
from app.services import series as series_svc
from app.services import series_view
from app.services.errors import Invalid, NotFound
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web.context import read_gate, render, sessions_of

router = APIRouter(include_in_schema=False)

NamePath = Annotated[str, Path(max_length=200)]


@router.get("/series")
def series_list_page(request: Request) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        items = series_svc.list_all(s)
    return render(request, "series_list.html", {"nav": "series", "items": items},
                  principal=principal)  # fmt: skip


@router.get("/series/{name}")
async def series_page(
    request: Request,
    name: NamePath,
    metric: Annotated[str | None, Query(max_length=64)] = None,
    track: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    try:
        sa.check_name(name)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None

    def build() -> dict[str, object]:
        view, out = series_view.detail(sessions_of(request), name, metric, track)
        trend = json_safe(out["trend"])
        figure = fs.trend_figure(trend, title=f"{trend['label']} of series {name}")
        return {
            "info": out,
            "trend": trend,
            "figure": plotly_json(json_safe(figure)),
            "point_of": {p["run_id"]: p for p in trend["points"]},
            "refs": [r.text for r in sa.refs()],
            "metric_text": view.trend.ref.text,
            "key_fields": KEY_FIELDS,
        }

    try:
        ctx = await anyio.to_thread.run_sync(build)
    except NotFound as e:
        raise HTTPException(404, e.detail) from None
    except Invalid as e:
        raise HTTPException(422, e.detail) from None
    return render(request, "series.html", {"nav": "series", "name": name, **ctx},
                  principal=principal)  # fmt: skip
