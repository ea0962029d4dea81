"""Text a target said, stored faithfully on SQLite and PostgreSQL (``TargetText``).

A target's error message or ``/metrics`` label may hold any character, U+0000 included,
which PostgreSQL's ``text`` refuses (a whole result batch failed on it). Columns that hold
what a target said (a request's and a job's error, a probe's error, a sweep's stop reason,
a server series' labels) use ``TargetText``, which escapes NUL reversibly and identically
on both databases:

- a value without NUL that does not begin with U+FDD0 is stored as it is (every value
  stored before this rule reads back unchanged);
- any other value is stored as U+FDD0 (a Unicode noncharacter, "for internal use") followed
  by the value with each ``\\`` doubled and each NUL written ``\\0``.

``decode`` reverses it exactly; the API, the pages and the exports show the original.
Strings from users are refused with a NUL instead (``app.protocol.nul``).
"""

from __future__ import annotations

import re

from sqlalchemy import Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

MARK = "\ufdd0"
NUL = "\x00"
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def encode(value: str) -> str:
    """``value`` as stored (unchanged unless it holds NUL or begins with ``MARK``)."""
    if NUL not in value and not value.startswith(MARK):
        return value
    return MARK + value.replace("\\", "\\\\").replace(NUL, "\\0")


def _unescape(m: re.Match[str]) -> str:
    c = m.group(1)
    return NUL if c == "0" else c


def decode(stored: str) -> str:
    """The value ``encode`` stored as ``stored``."""
    if not stored.startswith(MARK):
        return stored
    return _ESCAPE.sub(_unescape, stored[1:])


class TargetText(TypeDecorator[str]):
    """``TEXT`` holding what a target said, NUL included (see the module docstring)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else encode(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else decode(value)
