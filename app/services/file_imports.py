"""Import another tool's results (vLLM, GuideLLM, AIPerf) or a CSV log as stored runs.

All or nothing: every run of the file, its requests and the file's own figures are written
in one transaction, and a malformed file (``ImportFormatError`` names the first bad field or
line) writes nothing. GuideLLM, AIPerf and CSV files are parsed whole, then stored; a vLLM
file is read as a stream and stored as it is read, 1,000 requests at a time, the transaction
rolled back at the first error (``store_vllm_stream``; a file the streamed reader refuses is
parsed whole like the others). The runs of one file form a group (a GuideLLM sweep, an
appended vLLM file) tagged ``import-group:<id>``.

An import holds at most ``max_events`` events (token chunk times, every run of the file
together; ``Settings.max_import_events``): a vLLM file is refused as its ITLs are read,
before the gaps past the limit are kept, others once parsed and before anything is
stored (``ImportTooLarge``, nothing written). The server runs at most
``Settings.max_concurrent_imports`` at once (``ImportSlots``; the API answers 429).
"""

from __future__ import annotations

import io
import secrets
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.orm import Session, sessionmaker

from app import __version__
from app.analysis.metrics import per_request_metrics
from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, failure_note, run_status, tally
from app.domain import ClockSource, RequestRecord, RunStatus, trace_from_records
from app.importers.aiperf_export import parse_aiperf
from app.importers.common import (
    EventBudget,
    ImportedRun,
    ImportFormatError,
    ImportTooLarge,
    check_stored_text,
    refuse_nul_in_records,
)
from app.importers.csv_log import UNIT_NAMES, parse_csv_log
from app.importers.guidellm_json import parse_guidellm
from app.importers.json_stream import StreamRefused
from app.importers.vllm_result import parse_vllm_result
from app.importers.vllm_stream import VllmStream
from app.services.imports import check_import_size, import_events_limit, read_import_text
from app.services.runs import store_summaries
from app.storage import compare_repo
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope

FORMATS = ("csv", "vllm", "guidellm", "aiperf")
AIPERF_SUMMARY = "profile_export_aiperf.json"


class ImportSlots:
    """At most ``size`` imports running at once in this process (``try_take`` / ``give``):
    each holds its file's runs and their summary pass in memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._busy = 0

    def try_take(self) -> bool:
        with self._lock:
            if self._busy >= self.size:
                return False
            self._busy += 1
            return True

    def give(self) -> None:
        with self._lock:
            self._busy = max(0, self._busy - 1)


def _n_events(records: Iterable[RequestRecord]) -> int:
    return sum(int(r.event_t_ns.shape[0]) for r in records)


def parse_file(
    fmt: str,
    text: str,
    *,
    name: str,
    summary_text: str | None = None,
    time_unit: str | None = None,
) -> list[ImportedRun]:
    """The runs in ``text`` read as ``fmt``; ``ImportFormatError`` when malformed.
    ``time_unit``: a CSV log's (s, the default, ms or us); refused for other formats."""
    _check_time_unit(fmt, time_unit)
    if fmt == "vllm":
        return parse_vllm_result(text, name=name)
    if fmt == "guidellm":
        return parse_guidellm(text, name=name)
    if fmt == "aiperf":
        return [parse_aiperf(text, summary_text, name=name)]
    if fmt == "csv":
        log = parse_csv_log(text, time_unit=time_unit or "s")
        return [
            ImportedRun(
                name=name,
                format="csv",
                tool="CSV request log",
                profile=None,
                records=log.records,
                summary_only=True,
                notes=[f"times read in {UNIT_NAMES[log.time_unit]} (time unit {log.time_unit})"],
                meta={"origin_s": log.origin_s, "time_unit": log.time_unit},
            )
        ]
    raise ImportFormatError(f"format: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def _check_time_unit(fmt: str, time_unit: str | None) -> None:
    if time_unit is not None and fmt != "csv":
        raise ImportFormatError("time_unit: applies to CSV logs only (other formats state theirs)")


def _light(r: RequestRecord) -> RequestRecord:
    """What the run's status and failure note read of a request, without its events."""
    return RequestRecord(
        index=r.index,
        scheduled_ns=r.scheduled_ns,
        sent_ns=r.sent_ns,
        end_ns=r.end_ns,
        status=r.status,
        error=r.error,
        warmup=r.warmup,
    )


def _store_run(
    s: Session,
    run: ImportedRun,
    batches: Iterable[list[RequestRecord]],
    *,
    k: int,
    grouped: bool,
    group_id: str,
    file_name: str | None,
    now: datetime,
    budget: EventBudget | None = None,
) -> str:
    """One run, its requests a batch at a time (each batch's metrics its own: they are per
    request), then its status by the one rule (imports carry no error bound of their own:
    the default applies) and its notes, which are complete once every batch was read."""
    check_stored_text(run, file_name=file_name)  # nothing is written yet: a 422
    tags = ["import", f"import:{run.format}"]
    if grouped:
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
    light: list[RequestRecord] = []
    for batch in batches:
        refuse_nul_in_records(batch)  # the transaction rolls back every run of the file
        if budget is not None:
            budget.take(_n_events(batch))
        trace = trace_from_records(batch, include_warmup=True)
        repo.insert_requests(s, run_id, batch, per_request_metrics(trace))
        light.extend(_light(r) for r in batch)
    failed = failure_note(light, DEFAULT_MAX_ERROR_RATE)
    validity: list[str] = [failed] if failed else []
    if run.summary_only:
        validity.append("summary-only: the file has no per-token times")
    repo.finish_run(
        s,
        run_id,
        status=run_status(tally(light), stopped=False, max_error_rate=DEFAULT_MAX_ERROR_RATE),
        started_at=now,
        finished_at=now,
        validity=validity + list(run.notes),
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
    return run_id


def _cache_headlines(sessions: sessionmaker[Session], ids: list[str]) -> None:
    """Each run's page summary and headline figures (``store_summaries``)."""
    for run_id in ids:
        store_summaries(sessions, run_id)


def store_imported(
    sessions: sessionmaker[Session],
    runs: list[ImportedRun],
    *,
    file_name: str | None,
    max_events: int | None = None,
) -> list[str]:
    """Write every run in one transaction; then cache each run's headline figures.
    ``max_events``: ``ImportTooLarge`` (nothing written) when the runs hold more events."""
    if max_events is not None:
        budget = EventBudget(max_events)
        budget.take(sum(_n_events(run.records) for run in runs))
    group_id = secrets.token_hex(6)
    now = datetime.now(UTC)
    ids: list[str] = []
    with session_scope(sessions) as s:
        for k, run in enumerate(runs):
            ids.append(
                _store_run(
                    s,
                    run,
                    [run.records],
                    k=k,
                    grouped=len(runs) > 1,
                    group_id=group_id,
                    file_name=file_name,
                    now=now,
                )
            )
        if len(runs) > 1 and all(r.format == "guidellm" for r in runs):
            _group_as_sweep(s, runs, ids, file_name=file_name)
    _cache_headlines(sessions, ids)
    return ids


def store_vllm_stream(
    sessions: sessionmaker[Session],
    stream: BinaryIO,
    *,
    name: str,
    file_name: str | None,
    max_events: int | None = None,
) -> list[str]:
    """Read a vLLM result file from ``stream`` and store its runs as they are read, a batch
    of requests at a time, all in one transaction: an error anywhere rolls every run back.
    ``StreamRefused`` (nothing written) when the streamed reader cannot vouch for the file:
    read it with ``parse_vllm_result`` then. ``max_events``: ``ImportTooLarge`` (nothing
    written, the rest of the file unread) past that many events."""
    group_id = secrets.token_hex(6)
    now = datetime.now(UTC)
    ids: list[str] = []
    budget = EventBudget(max_events) if max_events is not None else None
    runs = VllmStream(stream, name=name, budget=budget)
    with session_scope(sessions) as s:
        try:
            for k, streamed in enumerate(runs):
                ids.append(
                    _store_run(
                        s,
                        streamed.run,
                        streamed.batches,
                        k=k,
                        grouped=streamed.several,
                        group_id=group_id,
                        file_name=file_name,
                        now=now,
                        budget=budget,
                    )
                )
        except ImportTooLarge:
            raise  # over a limit: the rest of the file is not read (nor read whole)
        except ImportFormatError:
            runs.drain()  # an error json would report first is in the rest of the file?
            raise
    _cache_headlines(sessions, ids)
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
        name=f"{(file_name or 'GuideLLM file')[:240]} (imported)",  # fits sweeps.name
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
    time_unit: str | None = None,
    max_events: int | None = None,
    streamed: bool = True,
) -> list[str]:
    """Parse, then store; returns the new run ids in file order. vLLM files are read as a
    stream (``store_vllm_stream``) unless the streamed reader refuses them (``streamed``:
    False when it already did). ``max_events``: default ``Settings.max_import_events``;
    ``time_unit``: a CSV log's (s, ms, us)."""
    _check_time_unit(fmt, time_unit)
    run_name = name or file_name or fmt
    limit = import_events_limit() if max_events is None else max_events
    if fmt == "vllm" and streamed:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: json reads it below
            data = None
        if data is not None:
            try:
                return store_vllm_stream(
                    sessions, io.BytesIO(data), name=run_name, file_name=file_name,
                    max_events=limit,
                )  # fmt: skip
            except StreamRefused:
                pass
            del data
    runs = parse_file(fmt, text, name=run_name, summary_text=summary_text, time_unit=time_unit)
    return store_imported(sessions, runs, file_name=file_name, max_events=limit)


def import_vllm_file(
    sessions: sessionmaker[Session],
    stream: BinaryIO,
    *,
    file_name: str | None,
    name: str | None = None,
    max_events: int | None = None,
) -> list[str] | None:
    """A vLLM file read as a stream from an open binary file (an upload spooled to disk):
    the new run ids, or None (nothing written) when the streamed reader refuses the file,
    which is then to be read whole (``import_text(..., streamed=False)``)."""
    limit = import_events_limit() if max_events is None else max_events
    try:
        return store_vllm_stream(
            sessions, stream, name=name or file_name or "vllm", file_name=file_name,
            max_events=limit,
        )  # fmt: skip
    except StreamRefused:
        return None


def import_path(
    sessions: sessionmaker[Session],
    fmt: str,
    path: Path,
    *,
    name: str | None = None,
    time_unit: str | None = None,
) -> list[str]:
    """Import a file from disk. A vLLM file is read as a stream (its size checked against the
    import limit first), or whole when the streamed reader refuses it. For AIPerf the
    summary beside the JSONL (``profile_export_aiperf.json``) is read too when it exists."""
    _check_time_unit(fmt, time_unit)
    if fmt == "vllm":
        check_import_size(path)
        with path.open("rb") as f:
            ids = import_vllm_file(sessions, f, file_name=path.name, name=name or path.name)
        if ids is not None:
            return ids
        # else json reads it: its result, or its error message, is the reference
    text = read_import_text(path)
    summary = None
    if fmt == "aiperf" and (path.parent / AIPERF_SUMMARY).is_file():
        summary = read_import_text(path.parent / AIPERF_SUMMARY)
    return import_text(
        sessions, fmt, text, file_name=path.name, name=name, summary_text=summary,
        time_unit=time_unit, streamed=False,
    )  # fmt: skip
