"""Streamed JSON for big import files: ijson (yajl) events, values built only where wanted.

The streamed reader is a fast path, not a second JSON dialect: whenever it cannot read the
bytes exactly as the standard library would (invalid UTF-8, a syntax error, a number past
64-bit integers or double range, ``NaN``/``Infinity``, a lone surrogate escape in a kept
string, a shape it does not handle), it raises ``StreamRefused`` and the caller reads the
file with ``json`` instead, whose result (or error message) is the reference. Pure: reads
only the stream it is given.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any, BinaryIO

import ijson

Event = tuple[str, Any]
_START = frozenset(("start_map", "start_array"))
# Nesting past this is left to ``json`` (which refuses ~1,000 levels: "nested too deeply")
MAX_DEPTH = 64
_END = frozenset(("end_map", "end_array"))


class StreamRefused(Exception):
    """The streamed reader cannot vouch for reading this file as ``json`` would."""


class Utf8Checked:
    """A binary stream whose bytes are checked as UTF-8 while they are read (``read``
    raises ``StreamRefused`` at the first invalid sequence, or at a truncated one at EOF)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._done = False

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        try:
            if data:
                self._decoder.decode(data, final=False)
            elif not self._done:
                self._done = True
                self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise StreamRefused("not UTF-8") from None
        return data


def json_events(stream: BinaryIO) -> Iterator[Event]:
    """ijson's basic events of every JSON value in ``stream``, one after another (numbers as
    ``int`` or ``float``). ijson's own errors surface as ``ijson.JSONError``: callers turn
    them into ``StreamRefused`` where they iterate (see ``refusing``)."""
    events: Iterator[Event] = ijson.basic_parse(
        Utf8Checked(stream), use_float=True, multiple_values=True
    )
    return events


def refused(e: Exception) -> StreamRefused:
    return StreamRefused(f"streamed JSON reader: {e}")


def build_value(first: Event, events: Iterator[Event]) -> Any:
    """The Python value (as ``json.loads`` builds it) that starts with event ``first``."""
    ev, val = first
    if ev not in _START:
        if ev == "string":
            _check_string(val)
        return val
    builder = ijson.ObjectBuilder()
    builder.event(ev, val)
    depth = 1
    for ev, val in events:
        if ev == "string" or ev == "map_key":
            _check_string(val)
        builder.event(ev, val)
        if ev in _START:
            depth += 1
            if depth > MAX_DEPTH:
                raise StreamRefused("nested deeply")
        elif ev in _END:
            depth -= 1
            if depth == 0:
                return builder.value
    raise StreamRefused("the value ends early")


def skip_value(first: Event, events: Iterator[Event]) -> None:
    """Read past the value that starts with event ``first``, building nothing."""
    if first[0] not in _START:
        return
    depth = 1
    for ev, _val in events:
        if ev in _START:
            depth += 1
            if depth > MAX_DEPTH:
                raise StreamRefused("nested deeply")
        elif ev in _END:
            depth -= 1
            if depth == 0:
                return
    raise StreamRefused("the value ends early")


def _check_string(s: str) -> None:
    """yajl turns a lone surrogate escape (``"\\ud800"``) into ``?`` where ``json`` keeps
    the surrogate: a kept string with ``?`` is read by ``json`` instead."""
    if "?" in s:
        raise StreamRefused("a string with '?' (possibly a lone surrogate escape)")
