"""The runs list's query string: filters (model, target, tag, status, source, created date
range), whether sweep steps are shown, and the page; messages name a bad field."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from app.domain import RunStatus

PAGE_SIZE = 50
MAX_PAGE = 1_000_000
FILTER_KEYS = ("model", "target", "tag", "status", "source", "since", "until")


@dataclass(frozen=True, slots=True)
class RunListQuery:
    model: str | None = None
    target: str | None = None
    tag: str | None = None
    status: str | None = None
    source: str | None = None
    since: dt.date | None = None  # created on or after this day (UTC)
    until: dt.date | None = None  # created on or before this day (UTC)
    steps: bool = False  # show sweep steps among the runs
    page: int = 1
    errors: dict[str, str] = field(default_factory=dict)

    def repo_filters(self) -> dict[str, Any]:
        """Keyword arguments of ``repository.list_runs``/``count_runs``."""
        return {
            "model": self.model,
            "target": self.target,
            "tag": self.tag,
            "status": self.status,
            "source": self.source,
            "since": _midnight(self.since),
            "until": _midnight(self.until + dt.timedelta(days=1)) if self.until else None,
            "sweep_steps": self.steps,
        }

    @property
    def offset(self) -> int:
        return (self.page - 1) * PAGE_SIZE

    def values(self) -> dict[str, str]:
        """The filters as the form shows them (blank when unset)."""
        out = {k: getattr(self, k) for k in FILTER_KEYS}
        return {k: "" if v is None else str(v) for k, v in out.items()}

    def active(self) -> bool:
        return any(self.values().values())

    def url(self, **change: Any) -> str:
        """This list's URL with some parameters changed (``page``, ``steps``)."""
        params = {k: v for k, v in self.values().items() if v}
        if self.steps:
            params["steps"] = "1"
        if self.page != 1:
            params["page"] = str(self.page)
        for k, v in change.items():
            if v in (None, False, "", 1) and k in ("page", "steps"):
                params.pop(k, None)
            else:
                params[k] = "1" if v is True else str(v)
        return "/?" + urlencode(params) if params else "/"


def _midnight(d: dt.date | None) -> dt.datetime | None:
    return None if d is None else dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC)


def _date(text: str, name: str, errors: dict[str, str]) -> dt.date | None:
    if not text:
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        errors[name] = f"{name}: not a date (YYYY-MM-DD): {text[:40]!r}"
        return None


def parse(params: dict[str, str]) -> RunListQuery:
    """The query from the page's query string; a bad value is left out and named in
    ``errors``."""
    errors: dict[str, str] = {}

    def text(name: str) -> str | None:
        return (params.get(name) or "").strip() or None

    status = text("status")
    if status is not None:
        try:
            status = RunStatus(status).value
        except ValueError:
            allowed = ", ".join(s.value for s in RunStatus)
            errors["status"] = f"status: one of {allowed}"
            status = None
    page = 1
    raw_page = text("page")
    if raw_page is not None:
        try:
            page = int(raw_page)
            if not 1 <= page <= MAX_PAGE:
                raise ValueError
        except ValueError:
            errors["page"] = f"page: a whole number from 1 to {MAX_PAGE:,}"
            page = 1
    since = _date(text("since") or "", "since", errors)
    until = _date(text("until") or "", "until", errors)
    if since and until and until < since:
        errors["until"] = "until: the range ends before it starts"
        until = None
    return RunListQuery(
        model=text("model"),
        target=text("target"),
        tag=text("tag"),
        status=status,
        source=text("source"),
        since=since,
        until=until,
        steps=params.get("steps") in ("1", "on", "true"),
        page=page,
        errors=errors,
    )
