"""/api/v1: import another tool's results, export a run, read its server metrics."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, File, Form, Request, UploadFile, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.datastructures import UploadFile as AnyUpload

from app.api.deps import Reader, Runner, SessionsDep, SettingsDep
from app.api.downloads import export_response
from app.importers.common import ImportFormatError, ImportTooLarge
from app.importers.csv_log import TIME_UNITS
from app.services import exports as export_svc
from app.services import file_imports
from app.services.errors import Busy, Invalid, NotFound, TooLarge
from app.services.file_imports import ImportSlots
from app.services.runs import RunNotFound
from app.settings import Settings
from app.storage import interop as interop_repo
from app.storage.db import session_scope

router = APIRouter(prefix="/api/v1", tags=["interop"])


class ImportResult(BaseModel):
    runs: list[str]


class SeriesOut(BaseModel):
    name: str
    labels: dict[str, str]
    kind: str | None
    t_ms: list[float]
    values: list[float]


async def _text(upload: AnyUpload, field: str, limit: int) -> str:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise Invalid(
            f"larger than the {limit}-byte import limit (TOKENTRACE_MAX_IMPORT_BYTES)",
            loc=["body", field],
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid(f"not UTF-8 text (byte {e.start})", loc=["body", field]) from None


async def run_import(
    sessions: Any,
    fmt: str,
    file: AnyUpload,
    summary: AnyUpload | None,
    name: str | None,
    settings: Settings,
    slots: ImportSlots,
    time_unit: str | None = None,
) -> list[str]:
    """Shared by the API and the import page: parse and store, or raise a ``ServiceError``
    (422 naming the bad field or line, 413 over ``max_import_events``, 429 while
    ``max_concurrent_imports`` imports run). A vLLM file is read as a stream from the
    upload (spooled to disk), never held whole; others are read as text, then parsed.
    ``time_unit``: a CSV log's (s, ms, us)."""
    if fmt not in file_imports.FORMATS:
        raise Invalid(f"choose from {', '.join(file_imports.FORMATS)}", loc=["body", "format"])
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise Invalid(f"choose from {', '.join(TIME_UNITS)}", loc=["body", "time_unit"])
    if time_unit is not None and fmt != "csv":
        raise Invalid("applies to CSV logs only", loc=["body", "time_unit"])
    if not slots.try_take():
        raise Busy(
            f"another import is running: the server runs at most {slots.size} at once "
            "(TOKENTRACE_MAX_CONCURRENT_IMPORTS); retry when it has finished"
        )
    try:
        return await _import(sessions, fmt, file, summary, name, settings, time_unit)
    except ImportTooLarge as e:
        raise TooLarge(str(e), loc=["body", "file"]) from None
    except ImportFormatError as e:
        raise Invalid(str(e), loc=["body", "file"]) from None
    finally:
        slots.give()


async def _import(
    sessions: Any,
    fmt: str,
    file: AnyUpload,
    summary: AnyUpload | None,
    name: str | None,
    settings: Settings,
    time_unit: str | None,
) -> list[str]:
    file_name = file.filename or None
    events = settings.max_import_events
    if fmt == "vllm":
        await file.seek(0)
        raw = file.file
        ids = await anyio.to_thread.run_sync(
            lambda: file_imports.import_vllm_file(
                sessions, raw, file_name=file_name, name=name or None, max_events=events
            )
        )
        if ids is not None:
            return ids
        await file.seek(0)  # the streamed reader refused it: json reads it whole
    limit = settings.max_import_bytes
    text = await _text(file, "file", limit)
    summary_text = await _text(summary, "summary", limit) if summary is not None else None
    return await anyio.to_thread.run_sync(
        lambda: file_imports.import_text(
            sessions,
            fmt,
            text,
            file_name=file_name,
            name=name or None,
            summary_text=summary_text,
            max_events=events,
            streamed=False,
            time_unit=time_unit,
        )
    )


@router.post("/imports", status_code=status.HTTP_201_CREATED)
async def import_file(
    request: Request,
    sessions: SessionsDep,
    settings: SettingsDep,
    _: Runner,
    format: Annotated[str, Form(description="csv | vllm | guidellm | aiperf")],
    file: Annotated[UploadFile, File(description="the tool's result file")],
    summary: Annotated[UploadFile | None, File(description="AIPerf summary JSON")] = None,
    name: Annotated[str | None, Form()] = None,
    time_unit: Annotated[
        str | None, Form(description="a CSV log's time unit: s (default), ms or us")
    ] = None,
) -> ImportResult:
    """Import a result file (all or nothing); 422 names the first bad field or line, 413
    a file over ``TOKENTRACE_MAX_IMPORT_EVENTS``, 429 while another import runs."""
    slots = request.app.state.import_slots
    unit = time_unit or None
    ids = await run_import(sessions, format, file, summary, name, settings, slots, time_unit=unit)
    return ImportResult(runs=ids)


@router.get("/runs/{run_id}/export/{what}", response_class=StreamingResponse)
def export_run(
    run_id: str, what: str, request: Request, sessions: SessionsDep, reader: Reader
) -> StreamingResponse:
    """``requests.csv|json|jsonl|parquet``, ``events.csv|jsonl|parquet`` or
    ``summary.json``, streamed; 429 when this client already streams 2 exports."""
    try:
        export_svc.check_run(sessions, run_id)
    except RunNotFound:
        raise NotFound(f"no run with id {run_id!r}") from None
    if what not in export_svc.FORMATS:
        raise Invalid(f"choose from {', '.join(export_svc.FORMATS)}", loc=["path", "what"])
    return export_response(request, sessions, run_id, what, reader)


@router.get("/runs/{run_id}/server-metrics")
def server_metrics(run_id: str, sessions: SessionsDep, _: Reader) -> list[SeriesOut]:
    """The target's Prometheus series scraped during the run (times: ms since run start)."""
    from app.storage import repository as repo

    with session_scope(sessions) as s:
        if repo.find_run(s, run_id) is None:
            raise NotFound(f"no run with id {run_id!r}")
        series = interop_repo.load_server_metrics(s, run_id)
    return [
        SeriesOut(
            name=x.name,
            labels=x.labels,
            kind=x.kind,
            t_ms=[t / 1e6 for t in x.t_ns],
            values=x.values,
        )
        for x in series
    ]
