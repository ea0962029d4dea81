"""Exports of a stored run: per-request rows (CSV, JSON, Parquet), per-event rows (CSV,
Parquet) and the run's summary JSON. Times are milliseconds on the run's axis; blank/null
where unknown. Reads storage; builds bytes; no HTTP."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.domain import EventKind
from app.services import runs as run_svc
from app.storage import browse
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe

PAGE = 5000
KIND_NAMES = {int(k): k.name.lower() for k in EventKind}
REQUEST_COLUMNS = (
    "idx",
    "warmup",
    "status",
    "error",
    "http_status",
    "scheduled_ms",
    "sent_ms",
    "end_ms",
    "send_lag_ms",
    "input_tokens",
    "output_tokens",
    "token_source",
    "ttft_ms",
    "ttfot_ms",
    "e2el_ms",
    "tpot_ms",
    "n_events",
)
EVENT_COLUMNS = ("idx", "event", "t_ms", "since_sent_ms", "kind", "tokens", "bytes")
FORMATS = {
    "requests.csv": "text/csv; charset=utf-8",
    "requests.json": "application/json",
    "requests.parquet": "application/vnd.apache.parquet",
    "events.csv": "text/csv; charset=utf-8",
    "events.parquet": "application/vnd.apache.parquet",
    "summary.json": "application/json",
}


def _ms(v: Any) -> float | None:
    return None if v is None else float(v) / 1e6


def request_row(r: dict[str, Any]) -> dict[str, Any]:
    """One request, typed (ms floats, ints, None where unknown)."""
    sent, sched = r.get("sent_ns"), r.get("scheduled_ns")
    status = r.get("status")
    return {
        "idx": int(r["idx"]),
        "warmup": bool(r.get("warmup")),
        "status": getattr(status, "value", status),
        "error": r.get("error"),
        "http_status": r.get("http_status"),
        "scheduled_ms": _ms(sched),
        "sent_ms": _ms(sent),
        "end_ms": _ms(r.get("end_ns")),
        "send_lag_ms": None if sent is None or sched is None else (sent - sched) / 1e6,
        "input_tokens": r.get("input_tokens"),
        "output_tokens": r.get("output_tokens"),
        "token_source": r.get("token_source"),
        "ttft_ms": _ms(r.get("ttft_ns")),
        "ttfot_ms": _ms(r.get("ttfot_ns")),
        "e2el_ms": _ms(r.get("e2e_ns")),
        "tpot_ms": _ms(r.get("tpot_ns")),
        "n_events": int(r.get("n_events") or 0),
    }


def iter_request_pages(
    sessions: sessionmaker[Session], run_id: str
) -> Iterator[list[dict[str, Any]]]:
    """The run's request rows (``request_row``), a page of ``PAGE`` at a time."""
    offset = 0
    while True:
        with session_scope(sessions) as s:
            rows = browse.request_rows(s, run_id, limit=PAGE, offset=offset)
        yield [request_row(r) for r in rows]
        if len(rows) < PAGE:
            return
        offset += PAGE


def request_rows(sessions: sessionmaker[Session], run_id: str) -> list[dict[str, Any]]:
    return [r for page in iter_request_pages(sessions, run_id) for r in page]


def iter_requests_csv(sessions: sessionmaker[Session], run_id: str) -> Iterator[str]:
    """requests.csv streamed page by page (a page's text per chunk)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_COLUMNS)
    for page in iter_request_pages(sessions, run_id):
        for r in page:
            w.writerow(_csv_cells(r, REQUEST_COLUMNS))
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()


# A text cell starting with one of these is a formula to a spreadsheet (CSV injection):
# ``=HYPERLINK(...)`` in an error message from the target would run when the file is opened.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: None blank; text that a spreadsheet would read as a formula
    gets a leading ``'`` (shown as text, the quote hidden); numbers, negative ones included,
    stay numbers."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _csv_cells(r: dict[str, Any], columns: tuple[str, ...]) -> list[Any]:
    return [csv_cell(r[c]) for c in columns]


def event_rows(sessions: sessionmaker[Session], run_id: str) -> list[dict[str, Any]]:
    """One row per stored event (chunk) of every request, in request then arrival order."""
    with session_scope(sessions) as s:
        records = repo.load_records(s, run_id)
    out: list[dict[str, Any]] = []
    for rec in records:
        sent = rec.sent_ns
        for j, (t, kind, tok, nb) in enumerate(
            zip(
                rec.event_t_ns.tolist(),
                rec.event_kind.tolist(),
                rec.event_tokens.tolist(),
                rec.event_bytes.tolist(),
                strict=True,
            )
        ):
            out.append(
                {
                    "idx": rec.index,
                    "event": j,
                    "t_ms": t / 1e6,
                    "since_sent_ms": None if sent is None else (t - sent) / 1e6,
                    "kind": KIND_NAMES.get(int(kind), str(kind)),
                    "tokens": int(tok),
                    "bytes": int(nb),
                }
            )
    return out


def to_csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(_csv_cells(r, columns))
    return buf.getvalue().encode("utf-8")


def to_parquet(
    rows: list[dict[str, Any]], columns: tuple[str, ...], types: dict[str, Any]
) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, types[c]) for c in columns])
    table = pa.Table.from_pydict({c: [r[c] for r in rows] for c in columns}, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _request_types() -> dict[str, Any]:
    import pyarrow as pa

    f, i, s = pa.float64(), pa.int64(), pa.string()
    types = {c: f for c in REQUEST_COLUMNS if c.endswith("_ms")}
    types |= {c: i for c in ("idx", "http_status", "input_tokens", "output_tokens", "n_events")}
    types |= {"warmup": pa.bool_(), "status": s, "error": s, "token_source": s}
    return types


def _event_types() -> dict[str, Any]:
    import pyarrow as pa

    return {
        "idx": pa.int64(),
        "event": pa.int64(),
        "t_ms": pa.float64(),
        "since_sent_ms": pa.float64(),
        "kind": pa.string(),
        "tokens": pa.int64(),
        "bytes": pa.int64(),
    }


def summary(sessions: sessionmaker[Session], run_id: str) -> dict[str, Any]:
    """The run's report plus, where present, the imported file's own figures and the server
    metrics that were scraped (series names and sample counts)."""
    report = run_svc.run_report(sessions, run_id)
    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, run_id)
        series = interop_repo.load_server_metrics(s, run_id)
    out: dict[str, Any] = {"report": report}
    if info is not None:
        out["imported"] = {
            "format": info.format,
            "tool": info.tool,
            "profile": info.profile,
            "file_name": info.file_name,
            "group_id": info.group_id,
            "window_s": info.window_s,
            "figures": info.figures,
            "meta": info.meta,
        }
    out["server_metrics"] = [
        {"name": s.name, "labels": s.labels, "kind": s.kind, "samples": len(s.t_ns)} for s in series
    ]
    return out


def export(sessions: sessionmaker[Session], run_id: str, what: str) -> bytes:
    """The bytes of one export (``what`` in ``FORMATS``). Raises ``run_svc.RunNotFound``."""
    with session_scope(sessions) as s:
        if repo.find_run(s, run_id) is None:
            raise run_svc.RunNotFound(run_id)
    if what == "summary.json":
        body = json.dumps(json_safe(summary(sessions, run_id)), indent=2, allow_nan=False)
        return body.encode("utf-8")
    if what.startswith("requests."):
        rows = request_rows(sessions, run_id)
        if what == "requests.csv":
            return to_csv(rows, REQUEST_COLUMNS)
        if what == "requests.json":
            return json.dumps(json_safe(rows), allow_nan=False).encode("utf-8")
        if what == "requests.parquet":
            return to_parquet(rows, REQUEST_COLUMNS, _request_types())
    if what.startswith("events."):
        rows = event_rows(sessions, run_id)
        if what == "events.csv":
            return to_csv(rows, EVENT_COLUMNS)
        if what == "events.parquet":
            return to_parquet(rows, EVENT_COLUMNS, _event_types())
    raise ValueError(f"unknown export {what!r}; choose from {', '.join(FORMATS)}")
