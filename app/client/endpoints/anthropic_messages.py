"""Surface ``anthropic-messages``: Anthropic's Messages API, ``POST /v1/messages``
(Anthropic, and servers that speak it: vLLM, llama.cpp, LiteLLM), streamed or answered whole.

Headers: the run's API key goes as ``x-api-key`` (not ``Authorization: Bearer``; the key is
bound to its targets as for any surface, ``app.client.target_keys``), and
``anthropic-version`` (``anthropic_version``, 2023-06-01 by default; a ``headers`` entry of
the run replaces it). Body: ``model``, ``messages`` (a text prompt as one user message; a
dataset's messages with their ``system`` messages taken out into the top-level ``system``,
as this API wants), ``max_tokens`` (required by the API: the output length), ``stream``,
``thinking`` (``{"type": "enabled", "budget_tokens": thinking_budget}`` when given), then
the sampling fields and ``extra_body``. No ``ignore_eos``: the API has no such field.

Its stream's events are JSON objects with a ``type``: ``message_start`` (its
``message.usage.input_tokens``: the prompt; with ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` added, the cache reads being the cached prompt tokens),
``content_block_start``/``_stop``, ``content_block_delta`` whose ``delta`` is a
``text_delta`` (output text: CONTENT), a ``thinking_delta`` (REASONING) or an
``input_json_delta`` (a tool call's arguments: TOOL_CALL), ``message_delta`` (its
``usage.output_tokens``: the output, thinking included), ``message_stop``, ``ping`` and
``error`` (fails the request with its message). TTFT is the first text, thinking or tool
delta, TTFOT the first text, as for chat. A non-streaming answer is one ``"type":
"message"`` with its ``content`` blocks and ``usage``. Multi-turn sessions send the
history as ``messages`` (its system messages as ``system``), each turn's body serialised
whole (``system_apart``: no prepared template, as chat's sessions have).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.client.datasets.base import Prompt, Workload
from app.client.endpoints.base import BodyParams, ClassifyFn, ResultRule, SpecFacts, dumps
from app.client.endpoints.chat import refuse_documents
from app.client.events import Classified, error_message, json_event
from app.domain import EventKind

_TOKEN_DELTAS = {
    "text_delta": ("text", EventKind.CONTENT),
    "thinking_delta": ("thinking", EventKind.REASONING),
    "input_json_delta": ("partial_json", EventKind.TOOL_CALL),
}
_OF_SHAPE = {"content_block_start", "content_block_stop", "message_stop", "ping"}


class AnthropicOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anthropic_version: str = Field(
        "2023-06-01",
        min_length=1,
        max_length=40,
        pattern=r"^[0-9A-Za-z.\-]+$",
        description="the anthropic-version header",
    )
    thinking_budget: int | None = Field(
        None,
        ge=1024,
        le=1_000_000,
        description="extended thinking: its budget_tokens (>= 1024, below the output length)",
    )


def _count(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def input_usage(usage: object) -> dict[str, Any] | None:
    """``message_start``'s usage as chat's: the prompt is ``input_tokens`` plus the cache's
    reads and writes (Anthropic counts them apart); the cache reads are its cached tokens."""
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return None
    reads = usage.get("cache_read_input_tokens")
    total = usage["input_tokens"]
    if isinstance(total, int) and not isinstance(total, bool):
        total += _count(reads) + _count(usage.get("cache_creation_input_tokens"))
    out: dict[str, Any] = {"prompt_tokens": total}
    if reads is not None:
        out["prompt_tokens_details"] = {"cached_tokens": reads}
    return out


class _Stream:
    """The classifier of one answer: ``message_start``'s input usage is kept and merged
    into ``message_delta``'s output usage (the event whose usage the record reads last)."""

    __slots__ = ("prompt",)

    def __init__(self) -> None:
        self.prompt: dict[str, Any] | None = None

    def classify(self, data: bytes | None) -> Classified:
        obj = json_event(data)
        if isinstance(obj, Classified):
            return obj
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return Classified(EventKind.ROLE, "", None, None)
            key, token = _TOKEN_DELTAS.get(str(delta.get("type")), ("", EventKind.ROLE))
            text = delta.get(key) if key else None
            if isinstance(text, str) and text:
                return Classified(token, text, None, None)
            return Classified(EventKind.ROLE, "", None, None)  # signature_delta, empty
        if kind == "message_start":
            message = obj.get("message")
            self.prompt = input_usage(message.get("usage") if isinstance(message, dict) else None)
            return Classified(EventKind.ROLE, "", self.prompt, None)
        if kind == "message_delta":
            usage = obj.get("usage")
            merged = dict(self.prompt or {})
            if isinstance(usage, dict):
                merged.update(input_usage(usage) or {})  # a later count of the prompt
                if "output_tokens" in usage:
                    merged["completion_tokens"] = usage["output_tokens"]
            return Classified(EventKind.USAGE, "", merged or None, None)
        if kind == "error":
            return Classified(EventKind.OTHER, "", None, error_message(obj.get("error")))
        if kind in _OF_SHAPE:
            return Classified(EventKind.ROLE, "", None, None)
        if kind == "message":
            return _whole(obj)
        if obj.get("error"):
            return Classified(EventKind.OTHER, "", None, error_message(obj["error"]))
        return Classified(EventKind.OTHER, "", None, None)  # another surface's: named at the end


def _whole(obj: dict[str, Any]) -> Classified:
    """A non-streaming answer: its content blocks' text (thinking first), its usage."""
    raw = obj.get("usage")
    usage = input_usage(raw)
    if isinstance(raw, dict) and "output_tokens" in raw:
        usage = (usage or {}) | {"completion_tokens": raw["output_tokens"]}
    content: list[str] = []
    thinking: list[str] = []
    for block in obj.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            content.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_use" and block.get("input") is not None:
            content.append(json.dumps(block["input"]))
    if any(content):
        return Classified(EventKind.CONTENT, "".join(thinking + content), usage, None)
    if any(thinking):
        return Classified(EventKind.REASONING, "".join(thinking), usage, None)
    return Classified(EventKind.ROLE, "", usage, None)


def split_system(messages: list[Any]) -> tuple[str | None, list[Any]]:
    """``system`` messages out of the list (joined, as the top-level ``system``), the rest."""
    system: list[str] = []
    rest: list[Any] = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system":
            c = m.get("content")
            if isinstance(c, str):
                system.append(c)
            elif isinstance(c, list):
                system += [p["text"] for p in c if isinstance(p, dict) and "text" in p]
        else:
            rest.append(m)
    return ("\n\n".join(system) if system else None), rest


class AnthropicMessagesEndpoint:
    name = "anthropic-messages"
    summary = "Anthropic Messages API (/v1/messages): x-api-key, content_block_delta events"
    options: type[BaseModel] = AnthropicOptions
    answer = "Anthropic Messages events (content_block_delta, ...)"
    streams = True
    generates = True
    items = ""
    conversation = True
    parts = False
    system_apart = True  # system messages go to the top-level "system" (sessions: no template)
    paths: tuple[str, ...] = ("/v1/messages",)

    def path(self, options: BaseModel) -> str:
        return self.paths[0]

    def request_headers(self, options: BaseModel) -> tuple[tuple[tuple[str, str], ...], str]:
        assert isinstance(options, AnthropicOptions)
        return (("anthropic-version", options.anthropic_version),), "x-api-key"

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        assert isinstance(options, AnthropicOptions)
        budget = options.thinking_budget
        if budget is not None and facts.output_len and facts.output_len <= budget:
            raise ValueError(
                f"endpoint_options.thinking_budget: {budget:,} must be below the output "
                f"length (max_tokens: output_len {facts.output_len:,} given)"
            )

    def batch(self, options: BaseModel) -> int:
        return 1

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        assert isinstance(options, AnthropicOptions)
        budget = options.thinking_budget
        for p in (*workload.warmup, *workload.measured):
            if budget is not None and p.output_len <= budget:  # a dataset's own lengths
                raise ValueError(
                    f"endpoint_options.thinking_budget: {budget:,} must be below each "
                    f"request's output length (max_tokens: {p.output_len:,} in the dataset)"
                )
        return refuse_documents(workload, self.name)

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        assert isinstance(options, AnthropicOptions)
        system: str | None = None
        if prompt.messages is not None:
            system, messages = split_system(prompt.messages)
        else:
            messages = [{"role": "user", "content": prompt.prompt or ""}]
        body: dict[str, Any] = {"model": params.model}
        if system is not None:
            body["system"] = system
        body["messages"] = messages
        body["max_tokens"] = prompt.output_len
        body["stream"] = params.stream
        if options.thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": options.thinking_budget}
        if params.extra_body:
            body.update(params.extra_body)
        return dumps(body)

    def classifier(self, options: BaseModel) -> ClassifyFn:
        return _Stream().classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        return None


ANTHROPIC_MESSAGES = AnthropicMessagesEndpoint()
