"""Surface ``responses``: OpenAI's Responses API, ``POST /v1/responses`` (OpenAI, vLLM,
``transformers serve``), streamed as semantic events or answered whole.

Body: ``model``, ``input`` (a text prompt as a string; a dataset's messages, or a session's
history, as a message list: ``system``/``developer``/``user``/``assistant`` roles),
``max_output_tokens`` (the output length), ``stream``, ``reasoning`` (``effort``,
``summary``, when given), then the sampling fields and ``extra_body``. Neither
``ignore_eos`` nor ``min_tokens``: the Responses API has no such field (strict servers
refuse unknown fields; give them in ``extra_body`` for a server that takes them).

Its stream's events are JSON objects with a ``type``: ``response.output_text.delta``
carries output text (CONTENT; ``response.function_call_arguments.delta``, a tool
call's arguments, is TOOL_CALL: output too), ``response.reasoning_text.delta`` and
``response.reasoning_summary_text.delta`` carry reasoning (REASONING): TTFT is the first of
either, TTFOT the first output text, as for chat. ``response.completed`` (or
``response.incomplete``: cut at ``max_output_tokens``) carries the usage: ``input_tokens``,
``output_tokens`` (reasoning included), ``output_tokens_details.reasoning_tokens``,
``input_tokens_details.cached_tokens``, read as chat's ``prompt_tokens`` /
``completion_tokens``. ``response.failed`` and ``error`` events fail the request with the
server's message. Any other ``response.*`` event is of this shape but carries no token; an
object without such a ``type`` (a chat chunk) is another surface's answer. A non-streaming
answer is one ``"object": "response"`` with its ``output`` items.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.client.datasets.base import Prompt, Workload
from app.client.endpoints.base import (
    BodyParams,
    ClassifyFn,
    ResultRule,
    SpecFacts,
    dumps,
)
from app.client.endpoints.chat import refuse_documents
from app.client.events import Classified, error_message, json_event
from app.domain import EventKind

OUTPUT_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
FINAL = ("response.completed", "response.incomplete")


class ResponsesOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="reasoning.effort: how much a reasoning model thinks (not sent if unset)"
    )
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = Field(
        None, description="reasoning.summary: ask for a summary of the reasoning (streamed)"
    )


def usage_as_chat(usage: object) -> dict[str, Any] | None:
    """A Responses API usage object as chat's: ``input_tokens`` -> ``prompt_tokens``,
    ``output_tokens`` -> ``completion_tokens``, the details as chat names them (a value that
    is not there stays out: the record reads what the server said, nothing else)."""
    if not isinstance(usage, dict):
        return None
    out: dict[str, Any] = {}
    if "input_tokens" in usage:
        out["prompt_tokens"] = usage["input_tokens"]
    if "output_tokens" in usage:
        out["completion_tokens"] = usage["output_tokens"]
    if "total_tokens" in usage:
        out["total_tokens"] = usage["total_tokens"]
    details = usage.get("output_tokens_details")
    if isinstance(details, dict) and "reasoning_tokens" in details:
        out["completion_tokens_details"] = {"reasoning_tokens": details["reasoning_tokens"]}
    cached = usage.get("input_tokens_details")
    if isinstance(cached, dict) and "cached_tokens" in cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached["cached_tokens"]}
    return out


def _failed(response: object) -> str:
    err = response.get("error") if isinstance(response, dict) else None
    return error_message(err if err else "response.failed")


def _whole(obj: dict[str, Any]) -> Classified:
    """A non-streaming answer: its output items' text (reasoning first), its usage."""
    usage = usage_as_chat(obj.get("usage"))
    if obj.get("status") == "failed":
        return Classified(EventKind.OTHER, "", usage, _failed(obj))
    content: list[str] = []
    reasoning: list[str] = []
    for item in obj.get("output") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call" and isinstance(item.get("arguments"), str):
            content.append(item["arguments"])
        parts = list(item.get("content") or ())
        if kind == "reasoning":
            parts += list(item.get("summary") or ())
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str) and text:
                (reasoning if kind == "reasoning" else content).append(text)
    if content:
        return Classified(EventKind.CONTENT, "".join(reasoning + content), usage, None)
    if reasoning:
        return Classified(EventKind.REASONING, "".join(reasoning), usage, None)
    return Classified(EventKind.ROLE, "", usage, None)


def classify(data: bytes | None) -> Classified:
    """One event of a Responses API stream (or its whole answer)."""
    obj = json_event(data)
    if isinstance(obj, Classified):
        return obj
    kind = obj.get("type")
    if kind in OUTPUT_DELTAS or kind in REASONING_DELTAS:
        delta = obj.get("delta")
        if not isinstance(delta, str) or not delta:
            return Classified(EventKind.ROLE, "", None, None)
        if kind == "response.function_call_arguments.delta":
            token = EventKind.TOOL_CALL  # a tool call's arguments: output (TTFTC)
        elif kind in OUTPUT_DELTAS:
            token = EventKind.CONTENT
        else:
            token = EventKind.REASONING
        return Classified(token, delta, None, None)
    if kind in FINAL:
        response = obj.get("response")
        usage = usage_as_chat(response.get("usage")) if isinstance(response, dict) else None
        return Classified(EventKind.USAGE if usage else EventKind.ROLE, "", usage, None)
    if kind == "response.failed":
        return Classified(EventKind.OTHER, "", None, _failed(obj.get("response")))
    if kind == "error":
        err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
        return Classified(EventKind.OTHER, "", None, error_message(err))
    if isinstance(kind, str) and kind.startswith("response."):
        return Classified(EventKind.ROLE, "", None, None)
    if obj.get("object") == "response":
        return _whole(obj)
    if obj.get("error"):
        return Classified(EventKind.OTHER, "", None, error_message(obj["error"]))
    return Classified(EventKind.OTHER, "", None, None)  # another surface's: named at the end


class ResponsesEndpoint:
    name = "responses"
    summary = "OpenAI Responses API (/v1/responses): semantic events, reasoning; sessions"
    options: type[BaseModel] = ResponsesOptions
    answer = "Responses API events (response.output_text.delta, ...)"
    streams = True
    generates = True
    items = ""
    conversation = True
    parts = False
    paths: tuple[str, ...] = ("/v1/responses",)

    def path(self, options: BaseModel) -> str:
        return self.paths[0]

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        return None

    def batch(self, options: BaseModel) -> int:
        return 1

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        return refuse_documents(workload, self.name)

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        assert isinstance(options, ResponsesOptions)
        source: str | list[Any] = (
            prompt.messages if prompt.messages is not None else (prompt.prompt or "")
        )
        body: dict[str, Any] = {
            "model": params.model,
            "input": source,
            "max_output_tokens": prompt.output_len,
            "stream": params.stream,
        }
        reasoning: dict[str, str] = {}
        if options.reasoning_effort is not None:
            reasoning["effort"] = options.reasoning_effort
        if options.reasoning_summary is not None:
            reasoning["summary"] = options.reasoning_summary
        if reasoning:
            body["reasoning"] = reasoning
        if params.extra_body:
            body.update(params.extra_body)
        return dumps(body)

    def classifier(self, options: BaseModel) -> ClassifyFn:
        return classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        return None


RESPONSES = ResponsesEndpoint()
