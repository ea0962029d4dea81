"""The simulator's ``chat`` surface: ``messages`` in (each message's content counted, plus the
config's ``chat_template_tokens``, plus ``image_tokens`` for each image part), chat
completion chunks out (``choices[].delta`` with ``content`` or ``reasoning_content``; a
role-only chunk first), or one ``chat.completion``.

A request carrying ``tools`` (``tool_choice`` not ``"none"``) is answered, with probability
``tool_call_rate`` (seeded by the request's messages), by one tool call
(``ToolCallShape``): the first delta names the function (the ``tool_choice``'s, else one of
``tools`` drawn by the seed) with the first argument text, every later delta carries
argument text only, the finish reason is ``tool_calls`` (``length`` when cut at
``max_tokens``). The tools' JSON counts in the prompt tokens (as a chat template renders
them)."""

from __future__ import annotations

import json
from typing import Any

from app.client.endpoints.chat import CHAT
from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import SimConfig
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import (
    BadRequest,
    Plan,
    count_chat_input,
    count_tokens,
    generation_plan,
    h64,
    text_of_content,
    unit,
)


class ChatShape:
    ident = "chatcmpl"
    chunk_object = b"chat.completion.chunk"
    answer_object = "chat.completion"
    content_open = b'"delta":{"content":"'
    reasoning_open = b'"delta":{"reasoning_content":"'
    close = b'"},"finish_reason":null}]}\n\n'
    role_chunk = True
    reasoning = True

    def finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "delta": {}, "finish_reason": finish_reason}

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        return {"index": 0, "message": message, "finish_reason": finish_reason}


class ToolCallShape(ChatShape):
    """A chat answer that is one tool call: the output tokens are its argument text."""

    content_open = b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"'
    close = b'"}}]},"finish_reason":null}]}\n\n'

    def __init__(self, name: str, call_id: str) -> None:
        self.name = name
        self.call_id = call_id
        self.first_open = (
            b'"delta":{"tool_calls":[{"index":0,"id":%b,"type":"function","function":{"name":%b,'
            b'"arguments":"' % (json_bytes(call_id), json_bytes(name))
        )

    def whole_choice(self, content: str, reasoning: str, finish_reason: str) -> dict[str, Any]:
        call = {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": content},
        }
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        if reasoning:
            message["reasoning_content"] = reasoning
        return {"index": 0, "message": message, "finish_reason": finish_reason}


MAX_TOOL_NAME = 64


def tool_names(tools: object) -> list[str]:
    """The function names of a request's ``tools`` (``BadRequest`` on a malformed one)."""
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    names: list[str] = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL_NAME:
            raise BadRequest(f"each of 'tools' needs a function.name of 1 to {MAX_TOOL_NAME} chars")
        names.append(name)
    return names


def count_images(messages: object) -> int:
    """The image parts (``{"type": "image_url", "image_url": {"url": ...}}``) of the
    messages (checked by ``count_chat_input`` first)."""
    n = 0
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "image_url":
                img = part.get("image_url")
                url = img.get("url") if isinstance(img, dict) else None
                if not isinstance(url, str) or not url:
                    raise BadRequest("an image_url part needs image_url.url")
                n += 1
    return n


def _tool_shape(body: dict[str, Any], source: object, config: SimConfig) -> ToolCallShape | None:
    """The shape of a tool-call answer, when the request carries tools and the seed says so."""
    tools = body.get("tools")
    if tools is None:
        return None
    names = tool_names(tools)
    choice = body.get("tool_choice")
    if not names or choice == "none":
        return None
    seed = json.dumps(source, sort_keys=True)
    if unit(config.seed, "tool_call", seed) >= config.tool_call_rate:
        return None
    name = names[h64(config.seed, "tool_name", seed) % len(names)]
    if isinstance(choice, dict):
        fn = choice.get("function")
        chosen = fn.get("name") if isinstance(fn, dict) else None
        if chosen not in names:
            raise BadRequest("'tool_choice' names a function that is not in 'tools'")
        name = str(chosen)
    return ToolCallShape(name, f"call_{h64(config.seed, 'call', seed):016x}")


class ChatSurface:
    endpoint = CHAT.name
    shape = ChatShape()

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        source = body.get("messages")
        tokens = count_chat_input(source) + config.chat_template_tokens
        tokens += count_images(source) * config.image_tokens
        if body.get("tools") is not None:
            tokens += count_tokens(json.dumps(body["tools"]))
        tool = _tool_shape(body, source, config)
        if tool is None:
            return generation_plan(body, self.endpoint, self.shape, source, tokens, config)
        plan = generation_plan(body, self.endpoint, tool, source, tokens, config)
        if plan.finish_reason == "stop":
            plan.finish_reason = "tool_calls"
        return plan

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        """Each message's tokens after a marker of its role."""
        out: list[str] = []
        for m in body.get("messages") or []:
            out.append(f"<|{m.get('role', '')}|>")
            out += PRETOKEN.findall(text_of_content(m.get("content")))
        return out


CHAT_SURFACE = ChatSurface()
