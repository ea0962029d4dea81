"""Classify one SSE event of an OpenAI-compatible stream (chat or completions: the classifier
of both surfaces, ``app.client.endpoints``).

``classify(data)`` returns a ``Classified``: the ``EventKind``, the generated text (content,
reasoning, or a tool call's deltas: ``delta.tool_calls[].function``, its name and argument
text, ``EventKind.TOOL_CALL``: output, token-bearing), the ``usage`` object when the event
carries one (also when the same chunk carries content or ``finish_reason``, as
``transformers serve`` does), and an error message when the event is not valid stream data
(non-JSON data line, ``{"error": ...}`` object).
``cached_prompt_tokens`` reads the prompt tokens the server served from its prefix cache off
the event that carried the usage object.
"""

from __future__ import annotations

import json
import json.decoder
from collections.abc import Callable
from typing import Any, NamedTuple

from app.domain import EventKind

DONE = b"[DONE]"
_SNIPPET = 200
MESSAGE_CHARS = 160  # of a target's error message, at most this much is kept
_CODE_CHARS = 40
_INT64_MAX = 2**63 - 1
# decodes one JSON string literal (C accelerated); not in the typing stubs
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class Classified(NamedTuple):
    kind: EventKind
    text: str
    usage: dict[str, Any] | None
    error: str | None
    items: int = 0  # the results a whole non-generative answer carries (embeddings, scores)


_OTHER = Classified(EventKind.OTHER, "", None, None)


def snippet(raw: bytes | str, limit: int = _SNIPPET) -> str:
    s = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    s = s.replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= limit else s[:limit] + "..."


def http_error_text(
    status: int | None, content_type: str | None, body: bytes, *, cut: bool = False
) -> str:
    """A request error for an HTTP error answer. The message of an OpenAI-style JSON error
    (``{"error": {"message": ...}}``, ``{"error": "..."}``, ``{"message"|"detail": "..."}``)
    is kept, its first ``MESSAGE_CHARS`` characters; any other body (an HTML page, another
    service's answer) only by its type and size (``cut``: the body went on past ``body``):
    a run must not be a way to read what other services say."""
    msg: str | None = None
    try:
        obj = json.loads(body) if body[:1] in (b"{", b" ", b"\n") else None
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            msg = err["message"]
        elif isinstance(err, str):
            msg = err
        else:
            for key in ("message", "detail"):
                if isinstance(obj.get(key), str):
                    msg = obj[key]
                    break
    if msg is not None:
        return f"HTTP {status}: {snippet(msg, MESSAGE_CHARS)}"
    kind = (content_type or "no content type").split(";")[0].strip()[:60]
    size = f"{len(body):,}{'+' if cut else ''}"
    return f"HTTP {status} ({kind}, {size} bytes; not shown: not a JSON error)"


def json_event(data: bytes | None) -> dict[str, Any] | Classified:
    """A data line's JSON object; else what the line is (``OTHER``): none, ``[DONE]`` or
    blank, not JSON (the reason says so), or JSON that is not an object."""
    if data is None or data == b"[DONE]" or not data.strip():
        return Classified(EventKind.OTHER, "", None, None)
    try:
        obj: Any = json.loads(data)
    except (ValueError, RecursionError):
        why = f"non-JSON data line ({len(data):,} bytes; not shown)"
        return Classified(EventKind.OTHER, "", None, why)
    if not isinstance(obj, dict):
        return Classified(EventKind.OTHER, "", None, None)
    return obj


def error_message(err: object) -> str:
    """An error object in the stream: its message (and code), bounded; nothing else of it."""
    if isinstance(err, dict):
        msg = err.get("message")
        code = err.get("code") or err.get("type")
        text = snippet(msg, MESSAGE_CHARS) if isinstance(msg, str) else "(no message)"
        if isinstance(code, str | int) and not isinstance(code, bool):
            text += f" ({snippet(str(code), _CODE_CHARS)})"
        return f"server error in stream: {text}"
    if isinstance(err, str | int | float):
        return f"server error in stream: {snippet(str(err), MESSAGE_CHARS)}"
    return "server error in stream: (no message)"


def _count(v: object) -> int | None:
    """A token count as a server reports it: a non-negative int that fits 64 bits, else
    None (a bool, a float, a string, a negative or huge number is not a count)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT64_MAX:
        return v
    return None


def cached_prompt_tokens(usage: dict[str, Any] | None, data: bytes | None) -> int | None:
    """The prompt tokens the server found in its prefix cache, from the event that carried
    the stream's usage object (``usage``, its data ``data``): OpenAI's
    ``usage.prompt_tokens_details.cached_tokens`` (llama.cpp always; vLLM with
    ``--enable-prompt-tokens-details``), else llama.cpp's ``timings.cache_n`` on the same
    chunk. None when the server said neither, or said something that is not a count."""
    if usage is None:
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        return _count(details["cached_tokens"])
    if data is None or b'"timings"' not in data:
        return None
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    timings = obj.get("timings") if isinstance(obj, dict) else None
    return _count(timings.get("cache_n")) if isinstance(timings, dict) else None


def classify(data: bytes | None) -> Classified:
    """Classify one event's data field (``None``: an event without data, e.g. a comment)."""
    if data is None or data == DONE:
        return _OTHER
    stripped = data.strip()
    if not stripped:
        return _OTHER
    # a data line that is not stream JSON is named by its size, not quoted: a run must not
    # be a way to read another service's event stream
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError):
        why = f"non-JSON data line ({len(data):,} bytes; not shown)"
        return Classified(EventKind.OTHER, "", None, why)
    if not isinstance(obj, dict):
        why = f"unexpected data line (JSON {type(obj).__name__}, {len(data):,} bytes; not shown)"
        return Classified(EventKind.OTHER, "", None, why)
    if obj.get("error"):
        return Classified(EventKind.OTHER, "", None, error_message(obj["error"]))
    usage_obj = obj.get("usage")
    usage = usage_obj if isinstance(usage_obj, dict) else None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        # a usage chunk has "choices" (empty, or with the finish); an object without it is
        # not of this stream's shape (its usage is still read)
        kind = EventKind.USAGE if usage and isinstance(choices, list) else EventKind.OTHER
        return Classified(kind, "", usage, None)
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[str] = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a non-streaming answer: the whole message
            delta = choice.get("message")
        if isinstance(delta, dict):
            c = delta.get("content")
            if isinstance(c, str) and c:
                content.append(c)
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(r, str) and r:
                reasoning.append(r)
            tc = delta.get("tool_calls")
            if isinstance(tc, list) and tc:
                calls += tool_call_texts(tc)
        else:
            t = choice.get("text")
            if isinstance(t, str) and t:
                content.append(t)
    if content:
        return Classified(EventKind.CONTENT, "".join(reasoning + content + calls), usage, None)
    if calls:
        return Classified(EventKind.TOOL_CALL, "".join(reasoning + calls), usage, None)
    if reasoning:
        return Classified(EventKind.REASONING, "".join(reasoning), usage, None)
    return Classified(EventKind.ROLE, "", usage, None)


def tool_call_texts(calls: list[Any]) -> list[str]:
    """The generated text of a chunk's ``tool_calls`` deltas (or a whole message's tool
    calls): each function's ``name`` (the first delta of a call) and ``arguments`` text. A
    delta of neither (an ``id`` alone) carries no text."""
    out: list[str] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            continue
        for key in ("name", "arguments"):
            v = fn.get(key)
            if isinstance(v, str) and v:
                out.append(v)
    return out


_PROBE = "\x01tokentrace-probe\x02"
_MAX_TEMPLATES = 2
_MAX_TEMPLATE_TRIES = 4


class Classifier:
    """``classify`` for the events of one stream, with a fast path for repeated chunks.

    A server streams nearly identical JSON chunks that differ only in the generated text,
    e.g. ``{"id":"x",...,"choices":[{"index":0,"delta":{"content":"<text>"},...}]}``. After
    an event classified the full way as content or reasoning, the stream learns a template
    from it: the bytes before and after the JSON string literal holding the text. A later
    event that is exactly ``prefix + one JSON string literal + suffix`` has the same JSON
    structure, so its classification is the template's with that string as the text: only
    the string literal is decoded (``json.decoder.scanstring``), not the whole object.

    Exactness: a template is only kept after a probe check (the template with a marker
    string parses to the same kind with the marker as the whole text, no usage, no error);
    anything that does not match a template byte for byte (error objects, non-JSON lines,
    usage chunks, an empty text, a different layout) takes the full ``classify`` path.
    """

    __slots__ = ("_templates", "_tries")

    def __init__(self) -> None:
        self._templates: list[tuple[bytes, bytes, int, EventKind]] = []
        self._tries = 0

    def classify(self, data: bytes | None) -> Classified:
        if data is not None:
            for prefix, suffix, lmin, kind in self._templates:
                if len(data) > lmin and data.startswith(prefix) and data.endswith(suffix):
                    mid = data[len(prefix) : len(data) - len(suffix)]
                    if mid[:1] != b'"':
                        break
                    try:
                        s = mid.decode()
                        text, end = _scanstring(s, 1, True)
                    except ValueError:  # UnicodeDecodeError is a ValueError
                        break
                    if end == len(s) and text:
                        return Classified(kind, text, None, None)
                    break
        c = classify(data)
        if (
            data is not None
            and c.text
            and c.usage is None
            and c.error is None
            and self._tries < _MAX_TEMPLATE_TRIES
        ):
            self._learn(data, c)
        return c

    def _learn(self, data: bytes, c: Classified) -> None:
        self._tries += 1
        doc = data.strip()
        found: tuple[int, int] | None = None
        for ascii_only in (False, True):
            try:
                lit = json.dumps(c.text, ensure_ascii=ascii_only).encode()
            except UnicodeEncodeError:  # lone surrogates: the text has no UTF-8 literal
                continue
            i = doc.find(lit)
            if i < 0 or doc.find(lit, i + 1) >= 0:
                continue
            found = (i, i + len(lit))
            break
        if found is None:
            return
        prefix, suffix = doc[: found[0]], doc[found[1] :]
        if not prefix or not suffix:
            return
        probe = classify(prefix + json.dumps(_PROBE).encode() + suffix)
        if probe != Classified(c.kind, _PROBE, None, None):
            return
        if len(self._templates) >= _MAX_TEMPLATES:
            self._templates.pop()  # the oldest
        self._templates.insert(0, (prefix, suffix, len(prefix) + len(suffix) + 1, c.kind))
