"""A request's record from a finished stream, as the runner builds it (``record_steps`` driven
to its end)."""

from __future__ import annotations

from typing import Any

from app.client.records import record_steps
from app.domain import RequestRecord


def finish_record(raw: Any, **kw: Any) -> RequestRecord:
    """``record_steps(raw, **kw)`` run to its end: the record."""
    steps = record_steps(raw, **kw)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            rec: RequestRecord = done.value
            return rec
