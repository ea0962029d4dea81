"""Imports: turn another tool's or a log's results into a stored run, all or nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from app import __version__
from app.analysis.metrics import per_request_metrics
from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, run_status, tally
from app.domain import ClockSource, RunStatus, trace_from_records
from app.importers.csv_log import ImportFormatError, parse_csv_log
from app.services.runs import store_summaries
from app.settings import get_settings
from app.storage import repository as repo
from app.storage.db import session_scope


def import_limit() -> int:
    """The largest import file, in bytes: ``Settings.max_import_bytes``, the one limit the
    CLI, the API and the import page all apply."""
    return get_settings().max_import_bytes


def check_import_size(path: Path, max_bytes: int | None = None) -> None:
    """``ImportFormatError`` when the file is over ``max_bytes`` (default ``import_limit()``)."""
    limit = import_limit() if max_bytes is None else max_bytes
    size = path.stat().st_size
    if size > limit:
        raise ImportFormatError(
            f"{path.name}: {size} bytes is larger than the {limit}-byte import limit "
            "(TOKENTRACE_MAX_IMPORT_BYTES)"
        )


def read_import_text(path: Path, max_bytes: int | None = None) -> str:
    """The file as UTF-8 text; ``ImportFormatError`` when it is over ``max_bytes`` (default
    ``import_limit()``) or not UTF-8."""
    check_import_size(path, max_bytes)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ImportFormatError(f"{path.name}: not UTF-8 text (byte {e.start})") from None


def import_csv(sessions: sessionmaker[Session], path: Path, *, name: str | None = None) -> str:
    """Import a SPEC worked-example-B CSV log. Raises ImportFormatError before writing."""
    log = parse_csv_log(read_import_text(path))
    trace = trace_from_records(log.records, include_warmup=True, summary_only=True)
    per_request = per_request_metrics(trace)
    now = datetime.now(UTC)
    with session_scope(sessions) as s:
        run_id = repo.create_run(
            s,
            None,
            source="import:csv",
            name=name or path.name,
            status=RunStatus.SUCCEEDED,
            client_version=__version__,
            client_host=None,
            summary_only=True,
            clock_source=ClockSource.IMPORTED,
        )
        repo.insert_requests(s, run_id, log.records, per_request)
        repo.finish_run(
            s,
            run_id,
            status=run_status(
                tally(log.records), stopped=False, max_error_rate=DEFAULT_MAX_ERROR_RATE
            ),
            started_at=now,
            finished_at=now,
            validity=["summary-only: the log has no per-token times"],
        )
    store_summaries(sessions, run_id)
    return run_id
