"""The simulator's ``responses`` surface (OpenAI's Responses API): ``input`` in (a string, or
a message list whose contents are strings or ``input_text``/``output_text`` parts; each
message's text counted plus the config's ``chat_template_tokens``; ``instructions`` counted
too), semantic events out in the client module's shape (``response.created``, the output
items, ``response.reasoning_text.delta`` then ``response.output_text.delta`` events,
``response.completed``, or ``response.incomplete`` when cut at ``max_output_tokens``, with
its usage), or one ``"object": "response"``."""

from __future__ import annotations

from typing import Any

from app.client.endpoints.responses import RESPONSES
from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import SimConfig
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import (
    BadRequest,
    Plan,
    Wire,
    count_tokens,
    generation_plan,
    int_field,
    sse,
    text_of_content,
)


def input_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each input message (a string input: one user message)."""
    raw = body.get("input")
    if isinstance(raw, str) and raw:
        return [("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'input' must be a non-empty string or list of messages")
    out: list[tuple[str, str]] = []
    for m in raw:
        if not isinstance(m, dict):
            raise BadRequest("each input item must be an object")
        out.append((str(m.get("role", "")), text_of_content(m.get("content"))))
    return out


def _usage(w: Wire) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": w.input_tokens}
    if w.cached_tokens is not None:
        usage["input_tokens_details"] = {"cached_tokens": w.cached_tokens}
    usage["output_tokens"] = w.output_tokens
    usage["output_tokens_details"] = {"reasoning_tokens": w.reasoning_tokens}
    usage["total_tokens"] = w.input_tokens + w.output_tokens
    return usage


def _items(w: Wire) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if w.reasoning_tokens:
        out.append(
            {
                "id": f"rs_{w.ident}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": w.reasoning}],
            }
        )
    out.append(
        {
            "id": f"msg_{w.ident}",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": w.content, "annotations": []}],
        }
    )
    return out


def _response(w: Wire, status: str, *, done: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": f"resp_{w.ident}",
        "object": "response",
        "created_at": w.created,
        "status": status,
        "model": w.model,
        "output": _items(w) if done else [],
    }
    if status == "incomplete":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    if done:
        out["usage"] = _usage(w)
    return out


def _status(w: Wire) -> str:
    return "incomplete" if w.finish_reason == "length" else "completed"


def _message_added(w: Wire) -> bytes:
    index = 1 if w.reasoning_tokens else 0
    item = {"id": f"msg_{w.ident}", "type": "message", "status": "in_progress",
            "role": "assistant", "content": []}  # fmt: skip
    part = {"type": "output_text", "text": "", "annotations": []}
    return sse(
        "response.output_item.added",
        {"type": "response.output_item.added", "output_index": index, "item": item},
    ) + sse(
        "response.content_part.added",
        {"type": "response.content_part.added", "item_id": f"msg_{w.ident}",
         "output_index": index, "content_index": 0, "part": part},
    )  # fmt: skip


class ResponsesShape:
    ident = "resp"
    chunk_object = b"response"
    answer_object = "response"
    content_open = b""
    reasoning_open = b""
    close = b'"}\n\n'
    role_chunk = True
    reasoning = True

    def finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {}

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]:
        return {}

    def prefixes(self, wire: Wire) -> tuple[bytes, bytes]:
        index = 1 if wire.reasoning_tokens else 0
        content = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"item_id":"msg_%s","output_index":%d,"content_index":0,"delta":"'
            % (wire.ident.encode(), index)
        )
        reasoning = (
            b'event: response.reasoning_text.delta\ndata: {"type":"response.reasoning_text.delta",'
            b'"item_id":"rs_%s","output_index":0,"content_index":0,"delta":"' % wire.ident.encode()
        )
        return content, reasoning

    def opening(self, wire: Wire) -> bytes:
        head = _response(wire, "in_progress", done=False)
        out = sse("response.created", {"type": "response.created", "response": head})
        out += sse("response.in_progress", {"type": "response.in_progress", "response": head})
        if not wire.reasoning_tokens:
            return out + _message_added(wire)
        item = {"id": f"rs_{wire.ident}", "type": "reasoning", "summary": [], "content": []}
        return out + sse(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        )

    def transition(self, wire: Wire) -> bytes:
        item = _items(wire)[0]
        done = {"type": "response.output_item.done", "output_index": 0, "item": item}
        return sse("response.output_item.done", done) + _message_added(wire)

    def closing(self, wire: Wire) -> bytes:
        index = 1 if wire.reasoning_tokens else 0
        text_done = {"type": "response.output_text.done", "item_id": f"msg_{wire.ident}",
                     "output_index": index, "content_index": 0, "text": wire.content}  # fmt: skip
        item_done = {"type": "response.output_item.done", "output_index": index,
                     "item": _items(wire)[-1]}  # fmt: skip
        status = _status(wire)
        final = {"type": f"response.{status}", "response": _response(wire, status, done=True)}
        return (
            sse("response.output_text.done", text_done)
            + sse("response.output_item.done", item_done)
            + sse(f"response.{status}", final)
        )

    def whole(self, wire: Wire) -> bytes:
        return json_bytes(_response(wire, _status(wire), done=True))


class ResponsesSurface:
    endpoint = RESPONSES.name
    shape = ResponsesShape()

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        texts = input_texts(body)
        instructions = body.get("instructions")
        tokens = sum(count_tokens(t) for _, t in texts) + config.chat_template_tokens
        if isinstance(instructions, str):
            tokens += count_tokens(instructions)
        max_out = int_field(body, "max_output_tokens", config.output_len)
        if max_out is not None and max_out < 1:
            raise BadRequest("'max_output_tokens' must be >= 1")
        view: dict[str, Any] = {
            k: body[k] for k in ("model", "stream", "ignore_eos", "min_tokens") if k in body
        }
        view["max_tokens"] = max_out
        plan = generation_plan(view, self.endpoint, self.shape, texts, tokens, config)
        plan.include_usage = True  # response.completed always carries it
        return plan

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        """Each message's tokens after a marker of its role."""
        out: list[str] = []
        for role, text in input_texts(body):
            out.append(f"<|{role}|>")
            out += PRETOKEN.findall(text)
        return out


RESPONSES_SURFACE = ResponsesSurface()
