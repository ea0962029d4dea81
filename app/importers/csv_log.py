"""Parse a per-request CSV log (SPEC worked example B) into request records. Pure: no I/O.

Columns: ``request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens`` (seconds,
any common origin). Each row becomes a successful request with two token events: the first
token at ``first_token_ts`` (1 token) and the rest at ``end_ts`` (n-1 tokens). Such a log
has no per-token times, so the run is summary-only. A bad row rejects the whole file with a
message naming the row; nothing is returned for partial use.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np

from app.domain import EventKind, RequestRecord, RequestStatus
from app.protocol.nul import NUL, NUL_REFUSED

REQUIRED = ("request_id", "start_ts", "first_token_ts", "end_ts", "input_tokens", "output_tokens")


MAX_TIME_S = 4e9  # seconds: beyond 2096 as a Unix time, and inside int64 nanoseconds
MAX_COUNT = 2**31 - 1  # token counts are stored as int32


class ImportFormatError(ValueError):
    """The file is malformed; the message names the first bad row or field."""


@dataclass(frozen=True)
class CsvLog:
    records: list[RequestRecord]
    request_ids: list[str]
    origin_s: float  # the earliest start_ts; record times are relative to it


def _number(row_no: int, name: str, raw: str | None, *, integer: bool) -> float:
    if raw is None or raw.strip() == "":
        raise ImportFormatError(f"row {row_no}: {name} is empty")
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ImportFormatError(f"row {row_no}: {name} must be {kind}, got {raw!r}") from None
    if not math.isfinite(value):
        raise ImportFormatError(f"row {row_no}: {name} must be finite, got {raw!r}")
    limit = MAX_COUNT if integer else MAX_TIME_S
    if not 0 <= value <= limit:
        raise ImportFormatError(f"row {row_no}: {name} must be in 0..{limit:g}, got {raw!r}")
    return float(value)


def parse_csv_log(text: str) -> CsvLog:
    """Parse the whole file or raise ``ImportFormatError`` naming the first bad row. A NUL
    (U+0000) anywhere is refused, naming its line (``app.protocol.nul``)."""
    at = text.find(NUL)
    if at >= 0:
        raise ImportFormatError(f"line {text.count(chr(10), 0, at) + 1}: {NUL_REFUSED}")
    try:
        return _parse(text)
    except csv.Error as e:  # e.g. a field over the csv module's 128 KiB field limit
        raise ImportFormatError(f"{_where(e)}: not valid CSV ({e})") from None


def _where(e: csv.Error) -> str:
    """The data row (1 = the first after the header) the csv module stopped at."""
    line = getattr(e, "line_num", None)
    return f"row {line - 1}" if isinstance(line, int) and line > 1 else "header"


class _Rows(csv.DictReader):  # type: ignore[type-arg]
    """``csv.DictReader`` whose errors carry the line they happened on."""

    def __next__(self) -> dict[str, str]:
        try:
            row: dict[str, str] = super().__next__()
        except csv.Error as e:
            e.line_num = self.reader.line_num  # type: ignore[attr-defined]
            raise
        return row


def _parse(text: str) -> CsvLog:
    reader = _Rows(io.StringIO(text))
    try:
        header = reader.fieldnames or []
    except csv.Error as e:
        e.line_num = 1  # type: ignore[attr-defined]
        raise
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ImportFormatError(f"header: missing column(s) {', '.join(missing)}")
    rows: list[tuple[str, float, float, float, int, int]] = []
    seen: set[str] = set()
    for row_no, row in enumerate(reader, start=1):
        rid = (row.get("request_id") or "").strip()
        if not rid:
            raise ImportFormatError(f"row {row_no}: request_id is empty")
        if rid in seen:
            raise ImportFormatError(f"row {row_no} ({rid}): duplicate request_id")
        seen.add(rid)
        start = _number(row_no, "start_ts", row.get("start_ts"), integer=False)
        first = _number(row_no, "first_token_ts", row.get("first_token_ts"), integer=False)
        end = _number(row_no, "end_ts", row.get("end_ts"), integer=False)
        n_in = int(_number(row_no, "input_tokens", row.get("input_tokens"), integer=True))
        n_out = int(_number(row_no, "output_tokens", row.get("output_tokens"), integer=True))
        if first < start:
            raise ImportFormatError(f"row {row_no} ({rid}): first_token_ts < start_ts")
        if end < first:
            raise ImportFormatError(f"row {row_no} ({rid}): end_ts < first_token_ts")
        if n_out < 1:
            raise ImportFormatError(f"row {row_no} ({rid}): output_tokens < 1")
        if n_in < 0:
            raise ImportFormatError(f"row {row_no} ({rid}): input_tokens < 0")
        rows.append((rid, start, first, end, n_in, n_out))
    if not rows:
        raise ImportFormatError("the file has no data rows")
    origin = min(r[1] for r in rows)

    def ns(t: float) -> int:
        return round((t - origin) * 1e9)

    records: list[RequestRecord] = []
    for i, (_rid, start, first, end, n_in, n_out) in enumerate(rows):
        if n_out == 1:
            t = np.array([ns(first)], np.int64)
            toks = np.array([1], np.int32)
        else:
            t = np.array([ns(first), ns(end)], np.int64)
            toks = np.array([1, n_out - 1], np.int32)
        records.append(
            RequestRecord(
                index=i,
                scheduled_ns=ns(start),
                sent_ns=ns(start),
                end_ns=ns(end),
                done_ns=ns(end),
                status=RequestStatus.OK,
                input_tokens=n_in,
                output_tokens=n_out,
                token_source="imported",
                event_t_ns=t,
                event_bytes=np.zeros(t.shape[0], np.int32),
                event_kind=np.full(t.shape[0], int(EventKind.CONTENT), np.int8),
                event_tokens=toks,
            )
        )
    return CsvLog(records=records, request_ids=[r[0] for r in rows], origin_s=origin)
