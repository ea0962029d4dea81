"""/api/v1/series: named series of runs, their runs, trends with change points, alerts and
the gate (a run judged against its series). A series name is ``[A-Za-z0-9._-]{1,100}``
(anything else: 422)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Path, Query, status
from pydantic import ConfigDict, Field

from app.analysis import series as sa
from app.analysis.series import NAME_RE
from app.api.deps import Reader, Runner, SecretBoxDep, SessionDep, SessionsDep, SettingsDep
from app.protocol.nul import NoNul
from app.services import series as series_svc
from app.services import series_alerts, series_gate, series_view
from app.services.errors import NotFound
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe

router = APIRouter(prefix="/api/v1/series", tags=["series"])

SeriesName = Annotated[
    str,
    Path(pattern=f"^{NAME_RE.pattern}$", description="the series' name, [A-Za-z0-9._-]{1,100}"),
]


class SeriesCreate(NoNul):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=f"^{NAME_RE.pattern}$", description="[A-Za-z0-9._-]{1,100}")
    vary: list[str] | None = Field(
        None, max_length=32, description="key fields allowed to differ (default: engine_version)"
    )
    on_mismatch: Literal["flag", "refuse"] = "flag"
    note: str | None = Field(None, max_length=10_000)


class RunRef(NoNul):
    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(min_length=1, max_length=32)


class BaselineBody(NoNul):
    model_config = ConfigDict(extra="forbid")
    run_id: str | None = Field(None, min_length=1, max_length=32)


class AlertCreate(NoNul):
    model_config = ConfigDict(extra="forbid")
    metric: str = Field(
        "ttft:p99", max_length=64, description="ttft:p99, e2el:p50, output_throughput, ..."
    )
    webhook: str = Field(max_length=2048, description="http(s) URL; JSON POST, `text` field")
    max_value: float | None = Field(None, description="a value worse than this breaks it")
    max_relative_pct: float | None = Field(
        None, gt=0, le=10_000, description="worse than the series' baseline by more, %"
    )
    change_points: bool = True


@router.get("")
def list_series(session: SessionDep, _: Reader) -> dict[str, Any]:
    """Every series with its runs by state, newest run, alerts and failed deliveries."""
    return {"items": series_svc.list_all(session)}


@router.post("", status_code=status.HTTP_201_CREATED)
def create_series(body: SeriesCreate, session: SessionDep, _: Runner) -> dict[str, Any]:
    """A new, empty series (409 when the name is taken). Runs also create their series
    (with the defaults) by naming it."""
    return series_svc.create(
        session, body.name, vary=body.vary, on_mismatch=body.on_mismatch, note=body.note
    )


@router.get("/{name}")
async def get_series(
    name: SeriesName,
    sessions: SessionsDep,
    _: Reader,
    metric: Annotated[str | None, Query(max_length=64)] = None,
    track: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The series, its runs (state, reason, trust), the trend of ``metric`` (default
    ttft:p99) with each run's interval and the change points, its current verdict and its
    alerts with their deliveries."""

    def build() -> dict[str, Any]:
        return series_view.detail(sessions, name, metric, track)[1]

    return json_safe(await anyio.to_thread.run_sync(build))  # type: ignore[no-any-return]


@router.get("/{name}/trend")
async def get_trend(
    name: SeriesName,
    sessions: SessionsDep,
    _: Reader,
    metric: Annotated[str | None, Query(max_length=64)] = None,
    track: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The trend of ``metric`` (e.g. ``ttft:p99``, ``output_throughput``) with the change
    points, each described (size, direction, runs on either side, fields changed)."""

    def build() -> dict[str, Any]:
        view = series_svc.load_view(sessions, name, series_svc.parse_ref(metric), track=track)
        return {"series": name, "tracks": view.tracks, **view.trend.to_dict()}

    return json_safe(await anyio.to_thread.run_sync(build))  # type: ignore[no-any-return]


@router.post("/{name}/runs")
def add_run(name: SeriesName, body: RunRef, sessions: SessionsDep, _: Runner) -> dict[str, Any]:
    """Move a run into the series (out of any other; the series is created if new). 409
    naming why when the series refuses its key; it then stays where it was."""
    return series_svc.move(sessions, body.run_id, name)


@router.delete("/{name}/runs/{run_id}")
def remove_run(
    name: SeriesName,
    run_id: Annotated[str, Path(max_length=32)],
    sessions: SessionsDep,
    _: Runner,
) -> dict[str, Any]:
    """Take a run out of the series (404 when it is not in it)."""
    with session_scope(sessions) as s:
        row = series_svc.get(s, name)
        current = series_svc.series_of_run(s, run_id)
    if current is None or current["name"] != row.name:
        raise NotFound(f"run {run_id!r} is not in series {name!r}")
    return series_svc.move(sessions, run_id, None)


@router.put("/{name}/baseline")
def set_baseline(
    name: SeriesName, body: BaselineBody, session: SessionDep, _: Runner
) -> dict[str, Any]:
    """The run relative thresholds are judged against (null: the first counted run)."""
    return series_svc.set_baseline(session, name, body.run_id)


@router.get("/{name}/alerts")
def list_alerts(name: SeriesName, session: SessionDep, _: Reader) -> dict[str, Any]:
    """The series' alert rules and its latest alerts with their delivery state."""
    return series_alerts.rules(session, name)


@router.post("/{name}/alerts", status_code=status.HTTP_201_CREATED)
def create_alert(
    name: SeriesName,
    body: AlertCreate,
    session: SessionDep,
    settings: SettingsDep,
    box: SecretBoxDep,
    _: Runner,
) -> dict[str, Any]:
    """A rule: thresholds and/or change points of one metric, to a webhook that passes the
    checks a run's base_url does (422 naming ``webhook`` otherwise)."""
    rel = None if body.max_relative_pct is None else body.max_relative_pct / 100.0
    return series_alerts.add_rule(
        session,
        settings,
        box,
        name,
        metric=body.metric,
        webhook=body.webhook,
        max_value=body.max_value,
        max_relative=rel,
        change_points=body.change_points,
    )


@router.delete("/{name}/alerts/{alert_id}")
def delete_alert(
    name: SeriesName,
    alert_id: Annotated[int, Path(ge=1, le=2**62)],
    session: SessionDep,
    _: Runner,
) -> dict[str, Any]:
    series_alerts.delete_rule(session, name, alert_id)
    return {"deleted": alert_id}


@router.get("/{name}/gate")
async def gate(
    name: SeriesName,
    sessions: SessionsDep,
    _: Reader,
    run_id: Annotated[str, Query(min_length=1, max_length=32)],
    metric: Annotated[list[str] | None, Query(max_length=16)] = None,
    threshold_pct: Annotated[float, Query(ge=0, le=1000)] = 5.0,
    allow_invalid: bool = False,
) -> dict[str, Any]:
    """The run judged against its series (``app.analysis.series.gate``): per metric, the
    verdict against the runs before it in its segment, and any threshold alert it breaks.
    409 when the run cannot be trusted (unless ``allow_invalid``) or is not in the series."""

    def build() -> dict[str, Any]:
        return series_gate.gate(
            sessions,
            name,
            run_id,
            metrics=metric or sa.gate_defaults(),
            threshold_pct=threshold_pct,
            allow_invalid=allow_invalid,
        )

    return json_safe(await anyio.to_thread.run_sync(build))  # type: ignore[no-any-return]
