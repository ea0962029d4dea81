"""What every importer returns, and the small checked readers they share. Pure: no I/O.

An importer turns one file into one or more ``ImportedRun``s: request records (times on a
run-relative nanosecond axis), whether the file had per-token (per-chunk) times, and the
file's own headline figures keyed like ``app.analysis.profiles`` metrics (``ttft``, ``tpot``,
``itl``, ``e2el``, ``request_throughput``, ...; statistics ``mean``, ``std``, ``p50`` ...
``max`` in ms, or ``value`` for throughputs) so a page can set them beside ours computed
under the same tool's definitions. A malformed file raises ``ImportFormatError`` naming
the first bad field or line; nothing is returned for partial use.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from app.client.url_checks import without_credentials
from app.domain import EventKind, RequestRecord, RequestStatus
from app.importers.csv_log import MAX_COUNT, ImportFormatError
from app.protocol.nul import NUL, NUL_REFUSED, refusal

__all__ = [
    "MAX_ABS_S",
    "MAX_COUNT",
    "EventBudget",
    "FileFigures",
    "ImportFormatError",
    "ImportTooLarge",
    "ImportedRun",
    "as_dict",
    "as_list",
    "check_stored_text",
    "chunk_record",
    "json_objects",
    "number",
    "numbered_name",
    "opt_number",
    "refuse_nul_in_records",
]

# metric key -> statistic ("mean", "std", "p50", ..., "max", "value") -> value
FileFigures = dict[str, dict[str, float | None]]


class ImportTooLarge(ImportFormatError):
    """The file is well-formed as far as it was read but over an import limit (its events):
    refused whole, the rest of it unread."""


class EventBudget:
    """At most ``limit`` events (token chunk times) in one import, counted as they are read
    (``take``) over every run of the file; past it ``ImportTooLarge`` names the limit and
    ``setting``, the option that raises it."""

    def __init__(self, limit: int, setting: str = "TOKENTRACE_MAX_IMPORT_EVENTS") -> None:
        self.limit = limit
        self.setting = setting
        self.used = 0

    def left(self) -> int:
        return self.limit - self.used

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise self.over()

    def over(self) -> ImportTooLarge:
        return ImportTooLarge(
            f"file: more than {self.limit:,} events (token chunk times) in one import; the "
            f"limit is {self.setting}"
        )


@dataclass(frozen=True)
class ImportedRun:
    """One run read from a file (one vLLM result object, one GuideLLM benchmark, ...)."""

    name: str
    format: str  # "vllm" | "guidellm" | "aiperf" | "csv"
    tool: str  # e.g. "vLLM bench serve", "GuideLLM 0.8.1"
    profile: str | None  # the definition profile the file's figures follow
    records: list[RequestRecord]
    summary_only: bool  # no per-token (per-chunk) times in the file
    figures: FileFigures = field(default_factory=dict)
    model: str | None = None
    target_url: str | None = None
    window_s: float | None = None  # the file's own observation window (its duration)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # JSON-safe facts about the run

    def __post_init__(self) -> None:  # the target is stored and listed: never its password
        if self.target_url is not None:
            object.__setattr__(self, "target_url", without_credentials(self.target_url))


def json_objects(text: str, *, what: str = "file") -> list[Any]:
    """Every JSON value in ``text``: one document, or several written one after another
    (``--append-result`` writes objects separated by newlines). Names the line of the first
    syntax error."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise ImportFormatError(
                f"line {e.lineno}: not valid JSON ({e.msg}, column {e.colno})"
            ) from None
        except RecursionError:
            raise ImportFormatError(f"the {what} is nested too deeply") from None
        except ValueError as e:  # an integer past Python's 4300-digit conversion limit
            raise ImportFormatError(f"the {what} holds a number out of range ({e})") from None
        out.append(obj)
    if not out:
        raise ImportFormatError(f"the {what} is empty")
    return out


def as_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ImportFormatError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ImportFormatError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def number(value: Any, where: str, *, minimum: float | None = None) -> float:
    """A finite number (bools refused); ``minimum`` inclusive."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImportFormatError(f"{where}: expected a number, got {_shown(value)}")
    try:
        v = float(value)
    except OverflowError:  # an integer of 309 or more digits
        raise ImportFormatError(f"{where}: number out of range, got {_shown(value)}") from None
    if not math.isfinite(v):
        raise ImportFormatError(f"{where}: expected a finite number, got {value!r}")
    if minimum is not None and v < minimum:
        raise ImportFormatError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return v


def _shown(value: Any) -> str:
    """``repr`` of a bad value, shortened (a 4000-digit number is not echoed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def opt_number(value: Any, where: str, *, minimum: float | None = None) -> float | None:
    return None if value is None else number(value, where, minimum=minimum)


def integer(
    value: Any, where: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """A whole number (``2.0`` is fine, ``2.5`` is not); ``minimum``/``maximum`` inclusive."""
    v = number(value, where)
    if v != int(v):
        raise ImportFormatError(f"{where}: expected an integer, got {_shown(value)}")
    if minimum is not None and v < minimum:
        raise ImportFormatError(f"{where}: must be >= {minimum}, got {_shown(value)}")
    if maximum is not None and v > maximum:
        raise ImportFormatError(f"{where}: must be <= {maximum}, got {_shown(value)}")
    return int(v)


MAX_ABS_S = 9.2e9  # |time| in seconds that fits int64 nanoseconds


def ns(seconds: float) -> int:
    if not abs(seconds) < MAX_ABS_S:  # also NaN
        raise ImportFormatError(f"a time of {seconds!r} s is out of range")
    return round(seconds * 1e9)


def chunk_record(
    index: int,
    *,
    sent_ns: int,
    chunk_t_ns: list[int] | npt.NDArray[np.int64],
    output_tokens: int | None,
    input_tokens: int | None,
    end_ns: int | None = None,
    usage_completion_tokens: int | None = None,
    usage_prompt_tokens: int | None = None,
) -> RequestRecord:
    """A successful request whose token-bearing chunks arrived at ``chunk_t_ns``.

    Files give chunk times, not tokens per chunk: each chunk counts one token and the
    request's ``output_tokens`` (the file's count) is what per-request metrics use."""
    t = np.asarray(chunk_t_ns, np.int64)
    last = int(t[-1]) if t.size else None
    return RequestRecord(
        index=index,
        scheduled_ns=sent_ns,
        sent_ns=sent_ns,
        end_ns=end_ns if end_ns is not None else (last if last is not None else sent_ns),
        done_ns=end_ns if end_ns is not None else last,
        status=RequestStatus.OK,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        usage_completion_tokens=usage_completion_tokens,
        usage_prompt_tokens=usage_prompt_tokens,
        token_source="imported",
        event_t_ns=t,
        event_bytes=np.zeros(t.shape[0], np.int32),
        event_kind=np.full(t.shape[0], int(EventKind.CONTENT), np.int8),
        event_tokens=np.ones(t.shape[0], np.int32),
    )


def failed_record(
    index: int, *, sent_ns: int | None, end_ns: int | None, error: str, input_tokens: int | None
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_ns=sent_ns or 0,
        sent_ns=sent_ns,
        end_ns=end_ns,
        status=RequestStatus.ERROR,
        error=error[:2000],
        input_tokens=input_tokens,
        token_source="imported",
    )


def two_point_record(
    index: int,
    *,
    sent_ns: int,
    first_ns: int,
    last_ns: int,
    end_ns: int,
    output_tokens: int,
    input_tokens: int | None,
) -> RequestRecord:
    """A successful request known only by its first and last token (summary-only)."""
    if output_tokens < 1:
        t = np.zeros(0, np.int64)
        toks = np.zeros(0, np.int32)
    elif output_tokens == 1:
        t = np.array([first_ns], np.int64)
        toks = np.array([1], np.int32)
    else:
        t = np.array([first_ns, last_ns], np.int64)
        toks = np.array([1, output_tokens - 1], np.int32)
    return RequestRecord(
        index=index,
        scheduled_ns=sent_ns,
        sent_ns=sent_ns,
        end_ns=end_ns,
        done_ns=end_ns,
        status=RequestStatus.OK,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        token_source="imported",
        event_t_ns=t,
        event_bytes=np.zeros(t.shape[0], np.int32),
        event_kind=np.full(t.shape[0], int(EventKind.CONTENT), np.int8),
        event_tokens=toks,
    )


# the lengths of the columns an import's strings go to (app/storage/models*.py)
STORED_LENGTHS = {"file name": 255, "name": 255, "model": 255, "tool": 64, "profile": 32}


def numbered_name(base: str, suffix: str) -> str:
    """The name of one of a file's several runs, ``base`` + ``suffix`` (`` #2 (...)``),
    ``base`` shortened so the whole fits the run name's column."""
    limit = STORED_LENGTHS["name"]
    return (base[: max(0, limit - len(suffix))] + suffix)[:limit]


def check_stored_text(run: ImportedRun, *, file_name: str | None) -> None:
    """``ImportFormatError`` naming the field when a string the import would store (the
    run's name, model, target, tool, notes, facts, figure names, or the file's name) holds
    a NUL or is longer than its column: an imported file is the user's input, refused
    rather than stored altered (``app.protocol.nul``)."""
    fields: dict[str, Any] = {
        "file name": file_name,
        "name": run.name,
        "model": run.model,
        "target_url": run.target_url,
        "tool": run.tool,
        "profile": run.profile,
        "notes": run.notes,
        "meta": run.meta,
        "figures": run.figures,
    }
    msg = refusal(fields)
    if msg is not None:
        raise ImportFormatError(msg)
    for key, limit in STORED_LENGTHS.items():
        value = fields[key]
        if isinstance(value, str) and len(value) > limit:
            raise ImportFormatError(
                f"{key}: {len(value)} characters, more than the {limit} stored: {value[:40]!r}..."
            )


def refuse_nul_in_records(records: list[RequestRecord]) -> None:
    """``ImportFormatError`` naming the request whose error message holds a NUL."""
    for r in records:
        if r.error is not None and NUL in r.error:
            raise ImportFormatError(f"request {r.index}: error {NUL_REFUSED}")
