"""The series picker of the launch and sweep forms (``templates/_series_picker.html``): the
names offered, and the chosen name read from a form (checked, its message beside the
field)."""

from __future__ import annotations

from fastapi import Request

from app.analysis.series import check_name
from app.services import series as series_svc
from app.storage.db import session_scope
from app.web.context import sessions_of

FIELD = "series"


def names(request: Request) -> list[str]:
    with session_scope(sessions_of(request)) as s:
        return series_svc.names(s)


def chosen(values: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """(the series named in the form, or None; the field's message when it is not valid)."""
    raw = (values.get(FIELD) or "").strip()
    if not raw:
        return None, {}
    try:
        return check_name(raw), {}
    except ValueError as e:
        return None, {FIELD: str(e)}
