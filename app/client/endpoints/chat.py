"""Surface ``chat``: OpenAI's ``POST /v1/chat/completions``.

Body: ``model``, ``messages`` (a dataset's messages, or its text prompt as one user
message), ``max_tokens``, ``stream`` (and ``stream_options.include_usage``), ``ignore_eos``
with ``min_tokens`` (vLLM's), then the sampling fields and ``extra_body``. Its stream's
token-bearing events are chunks whose ``choices[].delta`` carries ``content`` or
``reasoning_content``/``reasoning`` (``app.client.events``): TTFT is the first of either,
TTFOT the first content; a tool call's deltas (``delta.tool_calls[].function``: its name and
argument text) are output too, token-bearing (``EventKind.TOOL_CALL``: a request answered by
a tool call alone succeeds), and a dataset line's ``tools`` and ``tool_choice`` go into the
body after ``messages``; usage is read off the chunk that carries ``usage``. A
non-streaming answer (``stream`` false) is one event, its ``choices[].message``. The only
surface that takes a conversation (multi-turn sessions).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.client.datasets.base import Prompt, Workload
from app.client.endpoints.base import (
    BodyParams,
    ClassifyFn,
    NoOptions,
    ResultRule,
    SpecFacts,
    generation_body,
)
from app.client.events import Classifier


def refuse_documents(workload: Workload, name: str) -> Workload:
    """A generation surface sends one prompt: a dataset line of query + documents (a rerank
    line) is refused, naming the file."""
    if any(p.inputs is not None for p in (*workload.warmup, *workload.measured)):
        raise ValueError(
            f"dataset_path: a line has 'documents' (query + documents, for the rerank "
            f"endpoint); endpoint {name!r} sends a prompt or messages"
        )
    return workload


class ChatEndpoint:
    name = "chat"
    summary = "chat completions (/v1/chat/completions), streamed or not; multi-turn sessions"
    options: type[BaseModel] = NoOptions
    answer = "chat completion chunks (choices[].delta)"
    streams = True
    generates = True
    items = ""
    conversation = True
    parts = True
    paths: tuple[str, ...] = ("/v1/chat/completions",)

    def path(self, options: BaseModel) -> str:
        return "/v1/chat/completions"

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        return None

    def batch(self, options: BaseModel) -> int:
        return 1

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        return refuse_documents(workload, self.name)

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        messages: list[dict[str, Any]] = (
            prompt.messages
            if prompt.messages is not None
            else [{"role": "user", "content": prompt.prompt or ""}]
        )
        head: dict[str, Any] = {"model": params.model, "messages": messages}
        if prompt.body_fields:  # a dataset line's tools and tool_choice
            head.update(prompt.body_fields)
        return generation_body(head, prompt.output_len, params)

    def classifier(self, options: BaseModel) -> ClassifyFn:
        return Classifier().classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        return None


CHAT = ChatEndpoint()
