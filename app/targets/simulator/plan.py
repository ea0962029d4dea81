"""What a request asks for and what the simulator will answer, decided before a byte is
written: a ``Plan`` (each surface's handler, ``app.targets.simulator.surfaces``, checks its
body and counts its tokens; ``generation_plan`` is the part every generating surface shares;
``BadRequest`` on bad input), the stream's wire shape of a generating surface
(``StreamShape``), the fault the ``seq``-th request gets and the event it strikes before
(``decide_fault``, ``fault_event``), and the seed's deterministic draws (``h64``, ``unit``)
that every other random choice of the simulator is made from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import FAULT_ORDER, Fault, SimConfig


def count_tokens(text: str) -> int:
    """``BuiltinTokenizer().count(text)``, with the matching done in C (long prompts)."""
    return len(PRETOKEN.findall(text))


def h64(*parts: object) -> int:
    """A deterministic 64-bit hash of ``parts``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def unit(*parts: object) -> float:
    """A deterministic uniform draw in [0, 1) from ``parts``."""
    return h64(*parts) / 2.0**64


def decide_fault(config: SimConfig, seq: int) -> Fault:
    """The fault of the ``seq``-th completion request (1-based), from the seed alone."""
    u = unit(config.seed, "fault", seq)
    acc = 0.0
    for fault in FAULT_ORDER:
        acc += config.fault_rate(fault)
        if u < acc:
            return fault
    return Fault.NONE


class StreamShape(Protocol):
    """How a generating surface's stream and whole answer are written (its handler's)."""

    ident: str  # the answer id's prefix: "chatcmpl"
    chunk_object: bytes  # a chunk's "object": b"chat.completion.chunk"
    answer_object: str  # a whole answer's "object": "chat.completion"
    content_open: bytes  # a content chunk's choice up to its text: b'"delta":{"content":"'
    reasoning_open: bytes  # ... a reasoning chunk's
    close: bytes  # after the text, to the chunk's end (its blank line included)
    role_chunk: bool  # a role-only chunk opens the stream (when the config says so)
    reasoning: bool  # it streams reasoning first (config.reasoning_tokens)

    def finish_choice(self, finish_reason: str) -> dict[str, Any]: ...

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Wire:
    """What a stream of typed events writes around its deltas (``EventStreamShape``)."""

    ident: str  # the answer's id: "resp-sim-3"
    created: int
    model: str
    input_tokens: int
    cached_tokens: int | None  # None: the prefix cache is off
    output_tokens: int
    reasoning_tokens: int
    finish_reason: str  # "length" or "stop"
    reasoning: str  # the whole texts (closing events and whole answers carry them)
    content: str


@runtime_checkable
class EventStreamShape(StreamShape, Protocol):
    """A stream of typed events (the Responses API, Anthropic Messages) rather than chat-style
    chunks: its own bytes before each delta's text (``prefixes``), its opening events
    (written whatever the config's ``role_chunk``), the events between the last reasoning
    delta and the first content delta, its closing events (its usage among them, no
    ``[DONE]``) and its whole answer. Each returns SSE events (blank line included)."""

    def prefixes(self, wire: Wire) -> tuple[bytes, bytes]:
        """(a content delta's bytes up to its text, a reasoning delta's)."""
        ...

    def opening(self, wire: Wire) -> bytes: ...

    def transition(self, wire: Wire) -> bytes: ...

    def closing(self, wire: Wire) -> bytes: ...

    def whole(self, wire: Wire) -> bytes: ...


def sse(event: str, obj: dict[str, Any]) -> bytes:
    """One SSE event with its ``event:`` line (compact JSON)."""
    data = json.dumps(obj, separators=(",", ":"))
    return b"event: %s\ndata: %s\n\n" % (event.encode(), data.encode())


@dataclass(slots=True)
class Plan:
    """What one request asked for, and what the simulator will answer."""

    endpoint: str  # its surface (app.client.endpoints): "chat", "embeddings", ...
    stream: bool
    model: str
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    finish_reason: str
    include_usage: bool
    text_seed: str
    cached_tokens: int = 0  # prompt tokens the prefix cache held (``SimServer``)
    shape: StreamShape | None = None  # a generating surface's; None: one whole answer
    path: str = ""  # the request's path (a surface may answer in the shape its path asks)
    items: int = 0  # a whole answer's inputs (embeddings) or documents (rerank)
    answer: bytes | None = None  # the whole answer of a surface that does not generate


class BadRequest(ValueError):
    pass


def text_of_content(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    raise BadRequest("message content must be a string, a list of parts or null")


def count_chat_input(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    total = 0
    for m in messages:
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object")
        total += count_tokens(text_of_content(m.get("content")))
    return total


def count_prompt(prompt: object) -> int:
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(count_prompt(p) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")


def int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{name}' must be an integer")
    return v


def generation_plan(
    body: dict[str, Any],
    endpoint: str,
    shape: StreamShape,
    source: object,
    input_tokens: int,
    config: SimConfig,
) -> Plan:
    """The plan of a generating surface's request: ``source`` is its prompt (or messages)
    and ``input_tokens`` their count; the output length from ``max_tokens`` (or
    ``max_completion_tokens``), ``min_tokens``, ``ignore_eos`` and the config's ``eos_len``."""
    max_tokens = int_field(body, "max_tokens", None)
    if max_tokens is None:
        max_tokens = int_field(body, "max_completion_tokens", config.output_len)
    assert max_tokens is not None
    if max_tokens < 1:
        raise BadRequest("'max_tokens' must be >= 1")
    min_tokens = int_field(body, "min_tokens", 0) or 0
    n = max_tokens
    if not body.get("ignore_eos", False) and config.eos_len is not None:
        n = min(max_tokens, max(min_tokens, config.eos_len))
    opts = body.get("stream_options")
    model = body.get("model")
    reasoning = min(config.reasoning_tokens, n) if shape.reasoning else 0
    return Plan(
        endpoint=endpoint,
        stream=bool(body.get("stream", False)),
        model=model if isinstance(model, str) and model else config.model,
        input_tokens=input_tokens,
        output_tokens=n,
        reasoning_tokens=reasoning,
        finish_reason="length" if n >= max_tokens else "stop",
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage", False)),
        text_seed=json.dumps(source, sort_keys=True),
        shape=shape,
    )


def _event_count(plan: Plan, per_event: int) -> int:
    kr = plan.reasoning_tokens
    return -(-kr // per_event) + -(-(plan.output_tokens - kr) // per_event)


def fault_event(config: SimConfig, seq: int, plan: Plan) -> int:
    """Index of the event before which a disconnect / stall / malformed line happens."""
    if not plan.stream:
        return 0
    n_events = _event_count(plan, config.tokens_per_event)
    k = config.fault_after_tokens
    if k is None:
        event = int(unit(config.seed, "fault_at", seq) * n_events)
    else:
        kr, per = plan.reasoning_tokens, config.tokens_per_event
        event = -(-k // per) if k <= kr else -(-kr // per) + -(-(k - kr) // per)
    return min(event, n_events - 1)
