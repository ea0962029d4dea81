"""Exports of a stored run: per-request rows (CSV, JSON, JSON lines, Parquet; a multi-turn
run's requests carry ``session`` and ``turn``; ``cached_prompt_tokens`` where the server
reported its prefix-cache hits; a column per per-request metric of the registry, in its
unit, after ``token_source``), per-event rows (CSV, JSON lines, Parquet),
the per-turn table (``turns.csv``) and the run's summary JSON. Times are milliseconds on the
run's axis; blank/null where unknown. Reads storage; builds bytes; no HTTP.

Every export is a stream (``export_stream``): requests are read ``PAGE`` at a time, events
``EVENT_PAGE`` requests at a time (keyset paging), and each page is written out before the
next is read, so memory stays bounded however large the run (Parquet: one row group per
page, the footer at the end)."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import turns
from app.analysis.metric_defs import per_request
from app.analysis.phases import send_lag_ms_of_row
from app.domain import PHASES, EventKind
from app.protocol.packing import unpack_many
from app.services import run_turns
from app.services import runs as run_svc
from app.storage import browse
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.storage.metric_values import shown_value

PAGE = 5000
EVENT_PAGE = 200  # requests per page of an events export (x events each)
KIND_NAMES = {int(k): k.name.lower() for k in EventKind}
HEAD_COLUMNS = (
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
    "cached_prompt_tokens",
    "token_source",
)
TAIL_COLUMNS = (
    "n_events",
    *(f"{p}_ms" for p in PHASES),
    "conn_id",
    "conn_reused",
    "retries",
    "session",
    "turn",
    "model",
    "target",
)


def request_columns() -> tuple[str, ...]:
    """A request row's columns: its facts, each per-request metric (by its key) and its
    phases and connection."""
    return (*HEAD_COLUMNS, *(m.key for m in per_request()), *TAIL_COLUMNS)


EVENT_COLUMNS = ("idx", "event", "t_ms", "since_sent_ms", "kind", "tokens", "bytes")
FORMATS = {
    "requests.csv": "text/csv; charset=utf-8",
    "requests.json": "application/json",
    "requests.jsonl": "application/jsonl",
    "requests.parquet": "application/vnd.apache.parquet",
    "events.csv": "text/csv; charset=utf-8",
    "events.jsonl": "application/jsonl",
    "events.parquet": "application/vnd.apache.parquet",
    "summary.json": "application/json",
    "turns.csv": "text/csv; charset=utf-8",
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
        "send_lag_ms": send_lag_ms_of_row(r),
        "input_tokens": r.get("input_tokens"),
        "output_tokens": r.get("output_tokens"),
        "cached_prompt_tokens": r.get("cached_prompt_tokens"),
        "token_source": r.get("token_source"),
        **{m.key: shown_value(m, r) for m in per_request()},
        "n_events": int(r.get("n_events") or 0),
        **{f"{p}_ms": _ms(r.get(f"{p}_ns")) for p in PHASES},
        "conn_id": r.get("conn_id"),
        "conn_reused": r.get("conn_reused"),
        "retries": int(r.get("retries") or 0),
        "session": r.get("session_idx"),
        "turn": r.get("turn_idx"),
        "process": r.get("process_idx"),
        "shard": r.get("shard_idx"),
        "model": r.get("model"),
        "target": r.get("target"),
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
    columns = request_columns()
    w.writerow(columns)
    for page in iter_request_pages(sessions, run_id):
        for r in page:
            w.writerow(_csv_cells(r, columns))
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


def iter_event_tables(sessions: sessionmaker[Session], run_id: str) -> Iterator[Any]:
    """The run's events (request then arrival order) as Arrow tables (``EVENT_COLUMNS``),
    a page of ``EVENT_PAGE`` requests at a time; columns built with numpy, nulls where
    unknown (``since_sent_ms`` of a request never sent)."""
    import pyarrow as pa

    schema = pa.schema([(c, t) for c, t in _event_types().items()])
    names = np.array([KIND_NAMES.get(k, str(k)) for k in range(128)], dtype=object)
    after = -1
    while True:
        with session_scope(sessions) as s:
            page = repo.request_event_page(s, run_id, after_idx=after, limit=EVENT_PAGE)
        if not page:
            return
        idxs = np.fromiter((p[0] for p in page), np.int64, len(page))
        sents = np.fromiter((-1 if p[1] is None else p[1] for p in page), np.int64, len(page))
        offsets, ev = unpack_many([p[2] for p in page])
        del page
        counts = np.diff(offsets)
        sent = np.repeat(sents, counts)
        unknown = sent < 0
        kinds = pa.array(names[np.clip(ev.kind.astype(np.int64), 0, 127)], pa.string())
        yield pa.Table.from_arrays(
            [
                pa.array(np.repeat(idxs, counts)),
                pa.array(
                    np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
                ),
                pa.array(ev.t_ns / 1e6),
                pa.array((ev.t_ns - sent) / 1e6, mask=unknown),
                kinds,
                pa.array(ev.tokens.astype(np.int64)),
                pa.array(ev.nbytes.astype(np.int64)),
            ],
            schema=schema,
        )
        after = int(idxs[-1])


def iter_event_columns(
    sessions: sessionmaker[Session], run_id: str
) -> Iterator[dict[str, list[Any]]]:
    """The same pages as Python columns (``EVENT_COLUMNS`` -> values, None where unknown)."""
    for table in iter_event_tables(sessions, run_id):
        yield {c: table.column(c).to_pylist() for c in EVENT_COLUMNS}


def event_rows(sessions: sessionmaker[Session], run_id: str) -> list[dict[str, Any]]:
    """Every event as a row (small runs and tests; exports stream ``iter_event_columns``)."""
    out: list[dict[str, Any]] = []
    for cols in iter_event_columns(sessions, run_id):
        out += [
            dict(zip(EVENT_COLUMNS, vals, strict=True)) for vals in zip(*cols.values(), strict=True)
        ]
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
    types = {c: f for c in request_columns() if c.endswith("_ms")}
    types |= {m.key: f for m in per_request()}
    ints: tuple[str, ...] = ("idx", "http_status", "input_tokens", "output_tokens", "n_events")
    ints += ("cached_prompt_tokens",)
    ints += ("conn_id", "retries", "session", "turn")
    types |= {c: i for c in ints}
    types |= {
        "warmup": pa.bool_(),
        "status": s,
        "error": s,
        "token_source": s,
        "model": s,
        "target": s,
    }
    types |= {"conn_reused": pa.bool_()}
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


class _Drain:
    """A write-only file for pyarrow that hands out what was written since the last
    ``take()`` (Parquet streamed a row group at a time)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        b = bytes(data)
        self._parts.append(b)
        self._pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def _parquet_stream(
    pages: Iterator[Any], columns: tuple[str, ...], types: dict[str, Any]
) -> Iterator[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, types[c]) for c in columns])
    sink = _Drain()
    with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema) as writer:
        for cols in pages:
            table = (
                cols if isinstance(cols, pa.Table) else pa.Table.from_pydict(cols, schema=schema)
            )
            writer.write_table(table)
            chunk = sink.take()
            if chunk:
                yield chunk
    yield sink.take()


def _csv_stream(pages: Iterator[dict[str, list[Any]]], columns: tuple[str, ...]) -> Iterator[bytes]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for cols in pages:
        w.writerows(_csv_row(r) for r in zip(*(cols[c] for c in columns), strict=True))
        yield buf.getvalue().encode("utf-8")
        buf.seek(0)
        buf.truncate()
    tail = buf.getvalue()
    if tail:
        yield tail.encode("utf-8")


def _arrow_csv_stream(tables: Iterator[Any]) -> Iterator[bytes]:
    """CSV from Arrow tables (its C++ writer: no Python per row); the header once."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    first = True
    for table in tables:
        sink = pa.BufferOutputStream()
        opts = pacsv.WriteOptions(include_header=first, quoting_style="needed")
        pacsv.write_csv(table, sink, write_options=opts)
        first = False
        yield sink.getvalue().to_pybytes()


def _events_jsonl_stream(tables: Iterator[Any]) -> Iterator[bytes]:
    """JSON lines of the event tables, one f-string per row (no dict or json.dumps)."""
    for table in tables:
        cols = [table.column(c).to_pylist() for c in EVENT_COLUMNS]
        lines = [
            f'{{"idx":{i},"event":{e},"t_ms":{t!r},"since_sent_ms":'
            f'{"null" if ss is None else repr(ss)},"kind":"{k}","tokens":{tok},"bytes":{nb}}}'
            for i, e, t, ss, k, tok, nb in zip(*cols, strict=True)
        ]
        if lines:
            yield ("\n".join(lines) + "\n").encode("utf-8")


def _csv_row(values: tuple[Any, ...]) -> list[Any]:
    return ["" if v is None else v for v in values]


def _jsonl_stream(
    pages: Iterator[dict[str, list[Any]]], columns: tuple[str, ...]
) -> Iterator[bytes]:
    for cols in pages:
        lines = [
            json.dumps(json_safe(dict(zip(columns, r, strict=True))), allow_nan=False)
            for r in zip(*(cols[c] for c in columns), strict=True)
        ]
        if lines:
            yield ("\n".join(lines) + "\n").encode("utf-8")


def _request_pages(sessions: sessionmaker[Session], run_id: str) -> Iterator[dict[str, list[Any]]]:
    for rows in iter_request_pages(sessions, run_id):
        if rows:
            yield {c: [r[c] for r in rows] for c in request_columns()}


def _json_array_stream(sessions: sessionmaker[Session], run_id: str) -> Iterator[bytes]:
    yield b"["
    first = True
    for rows in iter_request_pages(sessions, run_id):
        for r in rows:
            yield (b"" if first else b",") + json.dumps(json_safe(r), allow_nan=False).encode()
            first = False
    yield b"]"


def export_stream(sessions: sessionmaker[Session], run_id: str, what: str) -> Iterator[bytes]:
    """One export (``what`` in ``FORMATS``) as a stream of chunks; the run must exist
    (``export`` checks)."""
    if what == "summary.json":
        body = json.dumps(json_safe(summary(sessions, run_id)), indent=2, allow_nan=False)
        return iter([body.encode("utf-8")])
    if what == "turns.csv":
        return iter([to_csv(turn_rows(sessions, run_id), turns.csv_columns())])
    if what == "requests.csv":
        return (chunk.encode("utf-8") for chunk in iter_requests_csv(sessions, run_id))
    if what == "requests.json":
        return _json_array_stream(sessions, run_id)
    if what == "requests.jsonl":
        return _jsonl_stream(_request_pages(sessions, run_id), request_columns())
    if what == "requests.parquet":
        return _parquet_stream(
            _request_pages(sessions, run_id), request_columns(), _request_types()
        )
    if what == "events.csv":
        return _arrow_csv_stream(iter_event_tables(sessions, run_id))
    if what == "events.jsonl":
        return _events_jsonl_stream(iter_event_tables(sessions, run_id))
    if what == "events.parquet":
        return _parquet_stream(iter_event_tables(sessions, run_id), EVENT_COLUMNS, _event_types())
    raise ValueError(f"unknown export {what!r}")


def turn_rows(sessions: sessionmaker[Session], run_id: str) -> list[dict[str, Any]]:
    """A multi-turn run's turn table, one row per turn, one column per statistic
    (``turns.csv_columns``); no row for a single-turn run."""
    with session_scope(sessions) as s:
        run = run_svc.run_dict(repo.get_run(s, run_id))
        table = run_turns.turn_table_of_run(s, run_id, run)
    return turns.flat_rows(table or [])


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


class ExportLimiter:
    """At most ``per_client`` exports streaming at once per client, ``total`` in all: a big
    export holds a database read and a connection for as long as it streams."""

    def __init__(self, *, per_client: int = 2, total: int = 8) -> None:
        self.per_client = per_client
        self.total = total
        self._lock = threading.Lock()
        self._by_client: dict[str, int] = {}
        self._n = 0

    def acquire(self, client: str) -> bool:
        with self._lock:
            if self._n >= self.total or self._by_client.get(client, 0) >= self.per_client:
                return False
            self._by_client[client] = self._by_client.get(client, 0) + 1
            self._n += 1
            return True

    def release(self, client: str) -> None:
        with self._lock:
            left = self._by_client.get(client, 0) - 1
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)
            self._n = max(0, self._n - 1)

    def busy(self, client: str) -> int:
        with self._lock:
            return self._by_client.get(client, 0)


def limited(stream: Iterator[bytes], limiter: ExportLimiter, client: str) -> Iterator[bytes]:
    """``stream``, giving the client's export slot back when it ends (or is abandoned)."""
    try:
        yield from stream
    finally:
        limiter.release(client)


def check_run(sessions: sessionmaker[Session], run_id: str) -> None:
    """Raises ``run_svc.RunNotFound`` unless the run exists."""
    with session_scope(sessions) as s:
        if repo.find_run(s, run_id) is None:
            raise run_svc.RunNotFound(run_id)


def export(sessions: sessionmaker[Session], run_id: str, what: str) -> bytes:
    """The bytes of one export, whole (tests, small runs). Raises ``run_svc.RunNotFound``."""
    check_run(sessions, run_id)
    return b"".join(export_stream(sessions, run_id, what))
