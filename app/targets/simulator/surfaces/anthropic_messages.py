"""The simulator's ``anthropic-messages`` surface (Anthropic's Messages API): ``system`` (a
string or text blocks) and ``messages`` in (each message's text counted, plus the config's
``chat_template_tokens``; ``max_tokens`` required, as the API wants), the client module's
events out: ``message_start`` (``usage.input_tokens``: the prompt less the prefix cache's
reads, given as ``cache_read_input_tokens`` when the cache is on), a ``thinking`` block of
``thinking_delta`` events when the config reasons, a ``text`` block of ``text_delta``
events, ``message_delta`` (``stop_reason``, ``usage.output_tokens``), ``message_stop``; or
one ``"type": "message"``. The request's headers are not checked (the client's are tested
apart)."""

from __future__ import annotations

from typing import Any

from app.client.endpoints.anthropic_messages import ANTHROPIC_MESSAGES
from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import SimConfig
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import (
    BadRequest,
    Plan,
    Wire,
    count_chat_input,
    count_tokens,
    generation_plan,
    int_field,
    sse,
    text_of_content,
)


def _system(body: dict[str, Any]) -> str:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list):
        return text_of_content(system)
    raise BadRequest("'system' must be a string or a list of text blocks")


def _usage_in(w: Wire) -> dict[str, Any]:
    if w.cached_tokens is None:
        return {"input_tokens": w.input_tokens}
    return {
        "input_tokens": w.input_tokens - w.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": w.cached_tokens,
    }


def _stop(w: Wire) -> str:
    return "max_tokens" if w.finish_reason == "length" else "end_turn"


def _block(index: int, kind: str) -> bytes:
    empty = {"type": kind, kind: ""} if kind == "thinking" else {"type": kind, "text": ""}
    start = {"type": "content_block_start", "index": index, "content_block": empty}
    return sse("content_block_start", start)


def _block_stop(index: int) -> bytes:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


class AnthropicShape:
    ident = "msg"
    chunk_object = b"message"
    answer_object = "message"
    content_open = b""
    reasoning_open = b""
    close = b'"}}\n\n'
    role_chunk = True
    reasoning = True

    def finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {}

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]:
        return {}

    def prefixes(self, wire: Wire) -> tuple[bytes, bytes]:
        index = 1 if wire.reasoning_tokens else 0
        content = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
            b'"delta":{"type":"text_delta","text":"' % index
        )
        reasoning = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"thinking_delta","thinking":"'
        )
        return content, reasoning

    def _message(self, wire: Wire, *, done: bool) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if done and wire.reasoning_tokens:
            content.append({"type": "thinking", "thinking": wire.reasoning, "signature": ""})
        if done:
            content.append({"type": "text", "text": wire.content})
        usage = _usage_in(wire) | {"output_tokens": wire.output_tokens if done else 1}
        return {
            "id": f"msg_{wire.ident}",
            "type": "message",
            "role": "assistant",
            "model": wire.model,
            "content": content,
            "stop_reason": _stop(wire) if done else None,
            "stop_sequence": None,
            "usage": usage,
        }

    def opening(self, wire: Wire) -> bytes:
        start = {"type": "message_start", "message": self._message(wire, done=False)}
        kind = "thinking" if wire.reasoning_tokens else "text"
        return sse("message_start", start) + _block(0, kind) + sse("ping", {"type": "ping"})

    def transition(self, wire: Wire) -> bytes:
        return _block_stop(0) + _block(1, "text")

    def closing(self, wire: Wire) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop(wire), "stop_sequence": None},
            "usage": {"output_tokens": wire.output_tokens},
        }
        return (
            _block_stop(1 if wire.reasoning_tokens else 0)
            + sse("message_delta", delta)
            + sse("message_stop", {"type": "message_stop"})
        )

    def whole(self, wire: Wire) -> bytes:
        return json_bytes(self._message(wire, done=True))


class AnthropicMessagesSurface:
    endpoint = ANTHROPIC_MESSAGES.name
    shape = AnthropicShape()

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        if "max_tokens" not in body:
            raise BadRequest("'max_tokens' is required")
        if int_field(body, "max_tokens", None) in (None, 0):
            raise BadRequest("'max_tokens' must be >= 1")
        messages = body.get("messages")
        tokens = count_chat_input(messages) + count_tokens(_system(body))
        tokens += config.chat_template_tokens
        view: dict[str, Any] = {
            k: body[k] for k in ("model", "stream", "max_tokens", "ignore_eos") if k in body
        }
        source = [_system(body), messages]
        plan = generation_plan(view, self.endpoint, self.shape, source, tokens, config)
        plan.include_usage = True  # message_start and message_delta always carry it
        return plan

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        """The system prompt's tokens, then each message's after a marker of its role."""
        out: list[str] = ["<|system|>", *PRETOKEN.findall(_system(body))]
        for m in body.get("messages") or []:
            out.append(f"<|{m.get('role', '')}|>")
            out += PRETOKEN.findall(text_of_content(m.get("content")))
        return out


ANTHROPIC_MESSAGES_SURFACE = AnthropicMessagesSurface()
