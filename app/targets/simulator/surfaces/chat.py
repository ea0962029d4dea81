"""The simulator's ``chat`` surface: ``messages`` in (each message's content counted, plus the
config's ``chat_template_tokens``), chat completion chunks out (``choices[].delta`` with
``content`` or ``reasoning_content``; a role-only chunk first), or one ``chat.completion``."""

from __future__ import annotations

from typing import Any

from app.client.endpoints.chat import CHAT
from app.client.tokenizer import PRETOKEN
from app.targets.sim_config import SimConfig
from app.targets.simulator.plan import Plan, count_chat_input, generation_plan, text_of_content


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


class ChatSurface:
    endpoint = CHAT.name
    shape = ChatShape()

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        source = body.get("messages")
        tokens = count_chat_input(source) + config.chat_template_tokens
        return generation_plan(body, self.endpoint, self.shape, source, tokens, config)

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        """Each message's tokens after a marker of its role."""
        out: list[str] = []
        for m in body.get("messages") or []:
            out.append(f"<|{m.get('role', '')}|>")
            out += PRETOKEN.findall(text_of_content(m.get("content")))
        return out


CHAT_SURFACE = ChatSurface()
