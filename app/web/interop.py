"""Pages: import a result file (form upload), and a run's other downloads."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect

from app.api.downloads import export_response
from app.api.routes_interop import run_import
from app.services import auth
from app.services import exports as export_svc
from app.services.errors import ServiceError
from app.services.file_imports import FORMATS
from app.services.runs import RunNotFound
from app.web.context import (
    csrf_ok,
    off_loop,
    principal_of,
    reads_allowed,
    render,
    sessions_of,
    settings_of,
)

router = APIRouter(include_in_schema=False)

FORMAT_LABELS = {
    "vllm": "vLLM bench serve --save-result JSON (--save-detailed or not; appended files too)",
    "guidellm": "GuideLLM benchmark JSON (every benchmark becomes a run)",
    "aiperf": "AIPerf profile_export.jsonl (add profile_export_aiperf.json as the summary)",
    "csv": "CSV request log (request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens;"
    " times in the unit chosen below)",
}


def _page(request: Request, error: str | None = None, status_code: int = 200) -> Response:
    principal = principal_of(request)
    ctx = {
        "nav": "import",
        "formats": FORMAT_LABELS,
        "error": error,
        "can_run": principal is not None and principal.has("run"),
    }
    return render(request, "import.html", ctx, principal=principal, status_code=status_code)


@router.get("/import")
def import_page(request: Request) -> Response:
    if not reads_allowed(request, principal_of(request)):
        return RedirectResponse("/signin?next=/import", status_code=303)
    return _page(request)


@router.post("/import")
async def import_submit(request: Request) -> Response:
    principal = principal_of(request)
    if principal is None or not principal.has("run"):
        return _page(request, "sign in with a token that has the 'run' scope to import", 403)
    try:
        form = await request.form()
    except ClientDisconnect:  # gone, or cut at the import limit (413 already answered)
        return _page(request, "file: the upload was cut off before its end", 400)
    if not csrf_ok(request, {"csrf": str(form.get("csrf") or "")}):
        return _page(request, "this form did not come from this dashboard's own page", 403)
    fmt = str(form.get("format") or "")
    file = form.get("file")
    summary = form.get("summary")
    name = str(form.get("name") or "") or None
    # the page always sends a unit: it applies to CSV logs only
    time_unit = (str(form.get("time_unit") or "") or None) if fmt == "csv" else None
    if fmt not in FORMATS:
        return _page(request, f"format: choose from {', '.join(FORMATS)}", 422)
    if not isinstance(file, UploadFile) or not file.filename:
        return _page(request, "file: choose a file to import", 422)
    summary_file = summary if isinstance(summary, UploadFile) and summary.filename else None
    try:
        settings, slots = settings_of(request), request.app.state.import_slots
        ids = await run_import(
            sessions_of(request), fmt, file, summary_file, name, settings, slots,
            time_unit=time_unit,
        )  # fmt: skip
    except ServiceError as e:
        return _page(request, f"{file.filename}: {e.detail}", e.status_code)
    await off_loop(auth.touch, sessions_of(request), principal)
    if len(ids) == 1:
        return RedirectResponse(f"/runs/{quote(ids[0])}", status_code=303)
    return RedirectResponse("/compare?" + "&".join(f"ids={quote(i)}" for i in ids), 303)


def _download(request: Request, run_id: str, what: str) -> Response:
    principal = principal_of(request)
    if not reads_allowed(request, principal):
        raise HTTPException(401, "sign in to read runs")
    try:
        export_svc.check_run(sessions_of(request), run_id)
    except RunNotFound:
        raise HTTPException(404, f"no run with id {run_id!r}") from None
    return export_response(request, sessions_of(request), run_id, what, principal)


def _route(what: str) -> None:
    def download(request: Request, run_id: str) -> Response:
        return _download(request, run_id, what)

    download.__name__ = "download_" + what.replace(".", "_")
    router.add_api_route(f"/runs/{{run_id}}/{what}", download, methods=["GET"])


# requests.csv and report.json are served by app.web.runs_exports
for _what in (
    "requests.json",
    "requests.jsonl",
    "requests.parquet",
    "events.csv",
    "events.jsonl",
    "events.parquet",
    "summary.json",
    "turns.csv",
):
    _route(_what)
