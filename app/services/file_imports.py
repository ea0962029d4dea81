"""Import another tool's results (vLLM, GuideLLM, AIPerf) or a CSV log as stored runs.

All or nothing: the whole file is parsed first (``ImportFormatError`` names the first bad
field or line, nothing is written), then every run of the file, its requests and the file's
own figures are written in one transaction. The runs of one file form a group (a GuideLLM
sweep, an appended vLLM file) tagged ``import-group:<id>``.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from app import __version__
from app.analysis.metrics import per_request_metrics
from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, failure_note, run_status, tally
from app.domain import ClockSource, RunStatus, trace_from_records
from app.importers.aiperf_export import parse_aiperf
from app.importers.common import ImportedRun, ImportFormatError
from app.importers.csv_log import parse_csv_log
from app.importers.guidellm_json import parse_guidellm
from app.importers.vllm_result import parse_vllm_result
from app.services.imports import read_import_text
from app.services.runs import store_summaries
from app.storage import compare_repo
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope

FORMATS = ("csv", "vllm", "guidellm", "aiperf")
AIPERF_SUMMARY = "profile_export_aiperf.json"


def parse_file(
    fmt: str, text: str, *, name: str, summary_text: str | None = None
) -> list[ImportedRun]:
    """The runs in ``text`` read as ``fmt``; ``ImportFormatError`` when malformed."""
    if fmt == "vllm":
        return parse_vllm_result(text, name=name)
    if fmt == "guidellm":
        return parse_guidellm(text, name=name)
    if fmt == "aiperf":
        return [parse_aiperf(text, summary_text, name=name)]
    if fmt == "csv":
        log = parse_csv_log(text)
        return [
            ImportedRun(
                name=name,
                format="csv",
                tool="CSV request log",
                profile=None,
                records=log.records,
                summary_only=True,
                meta={"origin_s": log.origin_s},
            )
        ]
    raise ImportFormatError(f"format: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def _status(run: ImportedRun) -> RunStatus:
    """By the one rule (imports carry no bound of their own: the default applies)."""
    return run_status(tally(run.records), stopped=False, max_error_rate=DEFAULT_MAX_ERROR_RATE)


def _validity(run: ImportedRun) -> list[str]:
    failed = failure_note(run.records, DEFAULT_MAX_ERROR_RATE)
    notes: list[str] = [failed] if failed else []
    if run.summary_only:
        notes.append("summary-only: the file has no per-token times")
    return notes + list(run.notes)


def store_imported(
    sessions: sessionmaker[Session], runs: list[ImportedRun], *, file_name: str | None
) -> list[str]:
    """Write every run in one transaction; then cache each run's headline figures."""
    group_id = secrets.token_hex(6)
    now = datetime.now(UTC)
    ids: list[str] = []
    with session_scope(sessions) as s:
        for k, run in enumerate(runs):
            tags = ["import", f"import:{run.format}"]
            if len(runs) > 1:
                tags.append(f"import-group:{group_id}")
            run_id = repo.create_run(
                s,
                None,
                source=f"import:{run.format}",
                name=run.name,
                status=RunStatus.SUCCEEDED,
                client_version=__version__,
                client_host=None,
                summary_only=run.summary_only,
                clock_source=ClockSource.IMPORTED,
                model=run.model,
                target_url=run.target_url,
                tags=tags,
            )
            trace = trace_from_records(run.records, include_warmup=True)
            repo.insert_requests(s, run_id, run.records, per_request_metrics(trace))
            repo.finish_run(
                s,
                run_id,
                status=_status(run),
                started_at=now,
                finished_at=now,
                validity=_validity(run),
            )
            interop_repo.add_import(
                s,
                run_id,
                format=run.format,
                tool=run.tool,
                profile=run.profile,
                file_name=file_name,
                group_id=group_id,
                group_index=k,
                figures=run.figures,
                window_s=run.window_s,
                meta=run.meta,
            )
            ids.append(run_id)
        if len(runs) > 1 and all(r.format == "guidellm" for r in runs):
            _group_as_sweep(s, runs, ids, file_name=file_name)
    for run_id in ids:
        store_summaries(sessions, run_id)
    return ids


def _achieved_rate(run: ImportedRun) -> float:
    fig = run.figures.get("request_throughput")
    value = fig.get("value") if isinstance(fig, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


def _group_as_sweep(
    s: Session, runs: list[ImportedRun], ids: list[str], *, file_name: str | None
) -> str:
    """A GuideLLM file's benchmarks are one sweep, a step per benchmark at its offered load.
    When the file does not state one kind of offered load for every benchmark (a
    synchronous + throughput + constant-rate profile), each step's load is the request rate
    the file measured, and the sweep's spec says so."""
    loads = [r.meta.get("load") for r in runs]
    kinds = {str(r.meta.get("load_kind")) for r in runs}
    stated = all(isinstance(x, int | float) for x in loads) and len(kinds) == 1
    load_kind = kinds.pop() if stated else "rate"
    if stated:
        values = [float(x) for x in loads]  # type: ignore[arg-type]
        basis = "offered load stated in the file"
    else:
        values = [_achieved_rate(r) for r in runs]
        basis = "achieved request rate measured by GuideLLM (no common offered load stated)"
    sweep_id = compare_repo.create_sweep(
        s,
        spec={"source": "import:guidellm", "file": file_name, "loads": basis},
        mode="concurrencies" if load_kind == "concurrency" else "rates",
        loads=values,
        name=f"{file_name or 'GuideLLM file'} (imported)",
        status="succeeded",
    )
    for k, (run_id, load) in enumerate(zip(ids, values, strict=True)):
        compare_repo.add_step(
            s, sweep_id, step_idx=k, run_id=run_id, load=load, load_kind=load_kind
        )
    return sweep_id


def import_text(
    sessions: sessionmaker[Session],
    fmt: str,
    text: str,
    *,
    file_name: str | None,
    name: str | None = None,
    summary_text: str | None = None,
) -> list[str]:
    """Parse, then store; returns the new run ids in file order."""
    runs = parse_file(fmt, text, name=name or file_name or fmt, summary_text=summary_text)
    return store_imported(sessions, runs, file_name=file_name)


def import_path(
    sessions: sessionmaker[Session], fmt: str, path: Path, *, name: str | None = None
) -> list[str]:
    """Import a file from disk. For AIPerf the summary beside the JSONL
    (``profile_export_aiperf.json``) is read too when it exists."""
    text = read_import_text(path)
    summary = None
    if fmt == "aiperf" and (path.parent / AIPERF_SUMMARY).is_file():
        summary = read_import_text(path.parent / AIPERF_SUMMARY)
    return import_text(sessions, fmt, text, file_name=path.name, name=name, summary_text=summary)
