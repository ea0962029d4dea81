"""What every API surface shares: the contract (``EndpointType``), the run's fields a surface
reads to build a request body (``BodyParams``) or to check the spec (``SpecFacts``), the
answer rule of a surface that does not stream tokens (``ResultRule``), and how an answer of
the wrong shape is named in an error (``describe_answer``).

A surface is one module of ``app.client.endpoints``: its path, the request body from a
prompt or a conversation, what each event of its answer is (its classifier: which events
carry tokens, where usage is read, hence what "first token" means), the answer a
non-streaming surface must give, and its own fields (``options``, given in
``RunSpec.endpoint_options``, extra fields forbidden).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from app.client.datasets.base import Prompt, Workload
from app.client.events import Classified, error_message
from app.domain import EventKind

ClassifyFn = Callable[[bytes | None], Classified]
_KEY_CHARS = 40
_KEYS_SHOWN = 4


class NoOptions(BaseModel):
    """A surface with no fields of its own (``endpoint_options`` must be empty)."""

    model_config = {"extra": "forbid"}


@dataclass(frozen=True, slots=True)
class BodyParams:
    """The run's fields every request body reads (its prompt apart)."""

    model: str
    ignore_eos: bool
    stream: bool
    extra_body: Mapping[str, object]  # the sampling fields that are set, then extra_body


@dataclass(frozen=True, slots=True)
class SpecFacts:
    """The run spec's fields a surface's own checks read."""

    dataset: str
    timed: bool  # the dataset gives each request's send time (a trace)
    multi_turn: bool
    output_len: int = 0  # the output tokens each request asks for (0: not given)


@dataclass(frozen=True, slots=True)
class ResultRule:
    """How the answer of a surface that generates no tokens is checked: it must carry
    ``results`` results (embeddings, scores); its event (``EventKind.ANSWER``) counts
    ``items`` (the inputs embedded, the documents scored: the run's items/s)."""

    results: int
    items: int


class EndpointType(Protocol):
    """One API surface. Registered in ``app.client.endpoints.ENDPOINTS``."""

    name: str
    summary: str  # one line, for --help, the API schema and the launch form
    options: type[BaseModel]  # its fields, given in RunSpec.endpoint_options (extra forbidden)
    answer: str  # what its answer is, in words, for errors: "chat completion chunks (choices)"
    streams: bool  # it streams its answer when asked (RunSpec.stream applies)
    generates: bool  # its answer is generated tokens: TTFT, ITL, TPOT and sampling apply
    conversation: bool  # it takes a conversation: multi-turn sessions may use it
    parts: bool  # it sends a dataset line's tools and images (chat content parts)
    items: str  # what its answer's items are, plural ("inputs", "documents"); "" if it generates
    paths: tuple[str, ...]  # every path it may send to (its options choose one)

    def path(self, options: BaseModel) -> str:
        """The request's path from the server's root, e.g. ``/v1/chat/completions``."""
        ...

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        """Cross-field checks: a ``ValueError`` whose text starts with a field's name and
        names the other field it conflicts with."""
        ...

    def batch(self, options: BaseModel) -> int:
        """The dataset's prompts one request carries (1 but for batched inputs)."""
        ...

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        """The dataset's prompts as this surface's requests (batched, checked); a
        ``ValueError`` naming ``dataset_path`` or ``dataset`` for prompts it cannot take."""
        ...

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        """The request's JSON body."""
        ...

    def classifier(self, options: BaseModel) -> ClassifyFn:
        """A fresh classifier of one answer's events (stream chunks, or the whole JSON
        answer as one event)."""
        ...

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        """The answer rule of a non-generative surface; None for one that generates tokens
        (its answer needs one token at least)."""
        ...


def dumps(obj: object) -> bytes:
    """A request body's JSON: compact separators, ASCII escapes."""
    return json.dumps(obj, separators=(",", ":")).encode()


def generation_body(head: dict[str, Any], output_len: int, params: BodyParams) -> bytes:
    """The body of an OpenAI-style generation request: ``head`` (model and input), then
    ``max_tokens``, ``stream`` (with usage asked for in the stream), ``ignore_eos`` with
    ``min_tokens`` (vLLM's), then ``extra_body`` over all of it."""
    body = head
    body["max_tokens"] = output_len
    body["stream"] = params.stream
    if params.stream:
        body["stream_options"] = {"include_usage": True}
    if params.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = output_len
    if params.extra_body:
        body.update(params.extra_body)
    return dumps(body)


def _safe_key(key: str) -> str | None:
    """A JSON key shown in an error: a short identifier, else None (not quoted)."""
    if len(key) <= _KEY_CHARS and key.replace("_", "").replace(".", "").isalnum():
        return key
    return None


def describe_value(obj: object, nbytes: int) -> str:
    """What a decoded answer is, in words, for an error that names what came: its
    ``object`` field, else its first keys (short identifiers only: a run must not be a way
    to read what another service says), else its JSON type and size."""
    if isinstance(obj, dict):
        kind = obj.get("object")
        if isinstance(kind, str) and _safe_key(kind):
            return f"a JSON object of 'object': {kind!r}"
        keys = [k for k in (_safe_key(str(k)) for k in list(obj)[:_KEYS_SHOWN]) if k]
        if keys:
            more = ", ..." if len(obj) > len(keys) else ""
            return "a JSON object with " + ", ".join(repr(k) for k in keys) + more
        return f"a JSON object ({nbytes:,} bytes; not shown)"
    if isinstance(obj, list):
        return f"a JSON list of {len(obj):,} items"
    return f"JSON {type(obj).__name__} ({nbytes:,} bytes; not shown)"


def describe_answer(data: bytes | None) -> str:
    """``describe_value`` of an event's data (not JSON: its size only)."""
    if data is None:
        return "an event without data"
    try:
        obj: Any = json.loads(data)
    except (ValueError, RecursionError):
        return f"a non-JSON answer ({len(data):,} bytes; not shown)"
    return describe_value(obj, len(data))


_OTHER = Classified(EventKind.OTHER, "", None, None)


def decode_answer(data: bytes | None, answer: str) -> tuple[Any, Classified | None]:
    """A whole JSON answer decoded: ``(obj, None)``; or ``(None, what it classifies as)``
    for an event without data or ``[DONE]`` (nothing), a non-JSON body or an error object
    (an error naming it)."""
    if data is None or data == b"[DONE]" or not data.strip():
        return None, _OTHER
    try:
        obj: Any = json.loads(data)
    except (ValueError, RecursionError):
        why = f"expected {answer}, got a non-JSON answer ({len(data):,} bytes; not shown)"
        return None, Classified(EventKind.OTHER, "", None, why)
    if isinstance(obj, dict) and obj.get("error"):
        return None, Classified(EventKind.OTHER, "", None, error_message(obj["error"]))
    return obj, None


def usage_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """An answer's ``usage`` object, when it is one."""
    usage = obj.get("usage")
    return usage if isinstance(usage, dict) else None


def wrong_shape(answer: str, data: bytes | None) -> str:
    """The error of an answer of another surface's shape: what was expected, what came."""
    return f"expected {answer}, got {describe_answer(data)}"


class KeyHeaders(Protocol):
    """What a surface whose requests carry their own headers adds (Anthropic's
    ``anthropic-version``) and where its API key goes (``x-api-key``): the optional
    ``request_headers`` method of an ``EndpointType``. A surface without it sends the key as
    ``Authorization: Bearer``."""

    def request_headers(self, options: BaseModel) -> tuple[tuple[tuple[str, str], ...], str]:
        """(its own headers, the header its API key goes in as is)."""
        ...


def surface_headers(
    kind: object, options: BaseModel
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The surface's own headers and its key's header (None: ``Authorization: Bearer``),
    for ``app.client.http_request.request_headers(surface=..., key_header=...)``."""
    fn = getattr(kind, "request_headers", None)
    if fn is None:
        return (), None
    own, key_header = fn(options)
    return tuple(own), key_header
