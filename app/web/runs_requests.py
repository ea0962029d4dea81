"""The requests table's query string: sort column and direction, status filter and ranges
(``<name>_min``/``<name>_max`` for each table metric in its unit: ``ttft_*`` ms, ``tpot_*``,
``e2e_*``; and ``output_tokens_*``); messages name a bad field. The same parameters travel
to a request page for its previous/next links. And its pager: page numbers around the
current one, first, last, and a page to jump to."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import urlencode

from app.analysis.metric_defs import Metric, shown
from app.domain import RequestStatus
from app.storage.request_table import FAILED, TableQuery, range_columns, sort_columns

STATUSES = (FAILED, *(s.value for s in RequestStatus))


def heading(m: Metric) -> str:
    """A table metric's column heading and filter label: "TTFT (ms)", "E2E (ms)"."""
    return f"{m.name} ({m.unit})"


def range_labels() -> dict[str, str]:
    """Filter name -> its label: each table metric, then the output tokens."""
    metrics = {m.column_name: heading(m) for m in shown("table")}
    return metrics | {"output_tokens": "output tokens"}


def param_keys() -> tuple[str, ...]:
    return ("sort", "dir", "status", *(f"{k}_{e}" for k in range_columns() for e in ("min", "max")))


@dataclass(frozen=True, slots=True)
class ParsedTable:
    query: TableQuery
    params: dict[str, str]  # the valid, non-default parameters (for links)
    values: dict[str, str]  # what the form shows
    errors: dict[str, str] = field(default_factory=dict)

    def qs(self, **extra: object) -> str:
        """``?`` + the parameters (and ``extra``), or empty."""
        params = self.params | {k: str(v) for k, v in extra.items() if v is not None}
        return "?" + urlencode(params) if params else ""


def parse(raw: dict[str, str]) -> ParsedTable:
    errors: dict[str, str] = {}
    values = {k: (raw.get(k) or "").strip() for k in param_keys()}
    params: dict[str, str] = {}
    sort = values["sort"] or "idx"
    sorts = sort_columns()
    if sort not in sorts:
        errors["sort"] = f"sort: one of {', '.join(sorts)}"
        sort = "idx"
    elif sort != "idx":
        params["sort"] = sort
    direction = values["dir"] or "asc"
    if direction not in ("asc", "desc"):
        errors["dir"] = "dir: asc or desc"
        direction = "asc"
    elif direction == "desc":
        params["dir"] = "desc"
    status: str | None = values["status"] or None
    if status is not None and status not in STATUSES:
        errors["status"] = f"status: one of {', '.join(STATUSES)}"
        status = None
    elif status is not None:
        params["status"] = status
    ranges: list[tuple[str, float | None, float | None]] = []
    for name in range_columns():
        ends: list[float | None] = []
        for end in ("min", "max"):
            key = f"{name}_{end}"
            text = values[key]
            if not text:
                ends.append(None)
                continue
            try:
                v = float(text)
                if not math.isfinite(v) or v < 0:
                    raise ValueError
            except ValueError:
                errors[key] = f"{key}: a number >= 0, got {text[:40]!r}"
                ends.append(None)
                continue
            ends.append(v)
            params[key] = text
        if ends[0] is not None or ends[1] is not None:
            ranges.append((name, ends[0], ends[1]))
    query = TableQuery(sort=sort, desc=direction == "desc", status=status, ranges=tuple(ranges))
    return ParsedTable(query, params, values, errors)


# ------------------------------------------------------------------------------ pager

PAGER_WIDTH = 2  # page links each side of the current page


@dataclass(frozen=True, slots=True)
class Pager:
    page: int  # 1-based, the page the offset falls in
    pages: int  # at least 1
    size: int
    window: list[int | None]  # page numbers to link, None where some are left out

    def offset_of(self, page: int) -> int:
        return (page - 1) * self.size


def page_window(page: int, pages: int, width: int = PAGER_WIDTH) -> list[int | None]:
    """1, the pages within ``width`` of ``page``, and ``pages``, in order; None marks a gap
    of two or more pages (a gap of one is shown as that page)."""
    wanted = {1, pages, *range(max(1, page - width), min(pages, page + width) + 1)}
    out: list[int | None] = []
    prev = 0
    for p in sorted(wanted):
        if p - prev == 2:
            out.append(p - 1)
        elif p - prev > 2:
            out.append(None)
        out.append(p)
        prev = p
    return out


def pager(offset: int, size: int, matching: int) -> Pager:
    pages = max(1, -(-matching // size))
    page = min(pages, offset // size + 1)
    return Pager(page, pages, size, page_window(page, pages))


def parse_page(raw: str | None, pages: int) -> tuple[int | None, str | None]:
    """``page`` from the jump form: (the page, None), (None, None) when blank, or (None, a
    message naming the field) when it is not a whole number from 1 to ``pages``."""
    text = (raw or "").strip()
    if not text:
        return None, None
    try:
        page = int(text)
    except ValueError:
        page = 0
    if not 1 <= page <= pages:
        return None, f"page: a whole number from 1 to {pages:,}, got {text[:40]!r}"
    return page, None
