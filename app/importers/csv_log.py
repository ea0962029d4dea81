"""Parse a per-request CSV log into request records (the format: docs/interop.md, "CSV
request log"). Pure: no I/O.

Columns: ``request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens``; times in
one unit for the whole file (``time_unit``: ``s``, the default, ``ms`` or ``us``), any common
origin. Each row becomes a successful request with two token events: the first token at
``first_token_ts`` (1 token) and the rest at ``end_ts`` (n-1 tokens). Such a log has no
per-token times, so the run is summary-only. A bad row rejects the whole file with a message
naming the row; nothing is returned for partial use. Implausible rows are bad rows: times
going backwards, a TTFT or E2E over ``MAX_REQUEST_S`` (one hour), a time per output token
over ``MAX_TPOT_S`` (10 s), which is what a file in milliseconds read as seconds shows.
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
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6}  # unit -> seconds
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
MAX_REQUEST_S = 3600.0  # a request's TTFT and E2E: one hour
MAX_TPOT_S = 10.0  # (end - first token) / (output tokens - 1): 0.1 tokens/s


class ImportFormatError(ValueError):
    """The file is malformed; the message names the first bad row or field."""


@dataclass(frozen=True)
class CsvLog:
    records: list[RequestRecord]
    request_ids: list[str]
    origin_s: float  # the earliest start_ts (seconds); record times are relative to it
    time_unit: str = "s"  # the unit the file's times were read in


def _number(row_no: int, name: str, raw: str | None, *, integer: bool, unit: str = "s") -> float:
    """A count, or a time in the file's ``unit`` returned in seconds."""
    if raw is None or raw.strip() == "":
        raise ImportFormatError(f"row {row_no}: {name} is empty")
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ImportFormatError(f"row {row_no}: {name} must be {kind}, got {raw!r}") from None
    if not math.isfinite(value):
        raise ImportFormatError(f"row {row_no}: {name} must be finite, got {raw!r}")
    limit = MAX_COUNT if integer else MAX_TIME_S / TIME_UNITS[unit]
    if not 0 <= value <= limit:
        raise ImportFormatError(f"row {row_no}: {name} must be in 0..{limit:g}, got {raw!r}")
    return float(value) if integer else float(value) * TIME_UNITS[unit]


def _plain(value: float, decimals: int) -> str:
    """A number without exponent or trailing zeros: 3601000, 33.92."""
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def _in(unit: str, seconds: float) -> str:
    """A duration in the file's unit, with seconds beside it when the unit is not seconds."""
    if unit == "s":
        return f"{_plain(seconds, 3)} s"
    return f"{_plain(seconds / TIME_UNITS[unit], 3)} {unit} ({_plain(seconds, 3)} s)"


def _plausible(row: str, unit: str, start: float, first: float, end: float, n_out: int) -> None:
    """Refuse a row no real request gives (times in seconds)."""
    hint = (
        f"times read in {UNIT_NAMES[unit]}: is the file in another time unit? "
        "(--time-unit s|ms|us, or the import's time_unit field)"
    )
    for what, value in (
        ("TTFT (first_token_ts - start_ts)", first - start),
        ("E2E (end_ts - start_ts)", end - start),
    ):
        if value > MAX_REQUEST_S:
            raise ImportFormatError(
                f"{row}: {what} is {_in(unit, value)}, over the {MAX_REQUEST_S:g} s bound "
                f"for one request; {hint}"
            )
    if n_out > 1:
        tpot = (end - first) / (n_out - 1)
        if tpot > MAX_TPOT_S:
            raise ImportFormatError(
                f"{row}: time per output token (end_ts - first_token_ts) / "
                f"(output_tokens - 1) is {tpot:.2f} s, over the {MAX_TPOT_S:g} s bound; {hint}"
            )


def parse_csv_log(text: str, *, time_unit: str = "s") -> CsvLog:
    """Parse the whole file, its times in ``time_unit`` (s, ms or us), or raise
    ``ImportFormatError`` naming the first bad row. A NUL (U+0000) anywhere is refused,
    naming its line (``app.protocol.nul``)."""
    if time_unit not in TIME_UNITS:
        raise ImportFormatError(
            f"time_unit: choose from {', '.join(TIME_UNITS)}, got {time_unit!r}"
        )
    at = text.find(NUL)
    if at >= 0:
        raise ImportFormatError(f"line {text.count(chr(10), 0, at) + 1}: {NUL_REFUSED}")
    try:
        return _parse(text, time_unit)
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


def _parse(text: str, unit: str) -> CsvLog:
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
        start = _number(row_no, "start_ts", row.get("start_ts"), integer=False, unit=unit)
        first = _number(
            row_no, "first_token_ts", row.get("first_token_ts"), integer=False, unit=unit
        )
        end = _number(row_no, "end_ts", row.get("end_ts"), integer=False, unit=unit)
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
        _plausible(f"row {row_no} ({rid})", unit, start, first, end, n_out)
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
    return CsvLog(
        records=records, request_ids=[r[0] for r in rows], origin_s=origin, time_unit=unit
    )
