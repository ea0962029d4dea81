"""Classify one SSE event of an OpenAI-compatible stream (chat or completions).

``classify(data)`` returns a ``Classified``: the ``EventKind``, the generated text (content or
reasoning), the ``usage`` object when the event carries one (also when the same chunk carries
content or ``finish_reason``, as ``transformers serve`` does), and an error message when the
event is not valid stream data (non-JSON data line, ``{"error": ...}`` object).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from app.domain import EventKind

DONE = b"[DONE]"
_SNIPPET = 200


class Classified(NamedTuple):
    kind: EventKind
    text: str
    usage: dict[str, Any] | None
    error: str | None


_OTHER = Classified(EventKind.OTHER, "", None, None)


def snippet(raw: bytes | str, limit: int = _SNIPPET) -> str:
    s = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    s = s.replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= limit else s[:limit] + "..."


def _error_message(err: object) -> str:
    if isinstance(err, dict):
        msg = err.get("message")
        code = err.get("code") or err.get("type")
        text = msg if isinstance(msg, str) else json.dumps(err)[:_SNIPPET]
        return f"server error in stream: {text}" + (f" ({code})" if code else "")
    return f"server error in stream: {snippet(str(err))}"


def classify(data: bytes | None) -> Classified:
    """Classify one event's data field (``None``: an event without data, e.g. a comment)."""
    if data is None or data == DONE:
        return _OTHER
    stripped = data.strip()
    if not stripped:
        return _OTHER
    try:
        obj = json.loads(stripped)
    except ValueError:
        return Classified(EventKind.OTHER, "", None, f"non-JSON data line: {snippet(data)}")
    if not isinstance(obj, dict):
        return Classified(EventKind.OTHER, "", None, f"unexpected data line: {snippet(data)}")
    if obj.get("error"):
        return Classified(EventKind.OTHER, "", None, _error_message(obj["error"]))
    usage_obj = obj.get("usage")
    usage = usage_obj if isinstance(usage_obj, dict) else None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return Classified(EventKind.USAGE if usage else EventKind.OTHER, "", usage, None)
    content: list[str] = []
    reasoning: list[str] = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            c = delta.get("content")
            if isinstance(c, str) and c:
                content.append(c)
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(r, str) and r:
                reasoning.append(r)
        else:
            t = choice.get("text")
            if isinstance(t, str) and t:
                content.append(t)
    if content:
        return Classified(EventKind.CONTENT, "".join(reasoning + content), usage, None)
    if reasoning:
        return Classified(EventKind.REASONING, "".join(reasoning), usage, None)
    return Classified(EventKind.ROLE, "", usage, None)
