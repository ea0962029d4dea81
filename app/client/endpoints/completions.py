"""Surface ``completions``: OpenAI's ``POST /v1/completions``.

Body: ``model``, ``prompt`` (a dataset's text prompt; chat messages are refused before
anything is sent), ``max_tokens``, ``stream`` (and ``stream_options.include_usage``),
``ignore_eos`` with ``min_tokens``, then the sampling fields and ``extra_body``. Its
stream's token-bearing events are chunks whose ``choices[].text`` is not empty
(``app.client.events``): TTFT is the first; usage is read off the chunk that carries
``usage``. A non-streaming answer is one event with the whole ``choices[].text``.
"""

from __future__ import annotations

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
from app.client.endpoints.chat import refuse_documents
from app.client.events import Classifier


class CompletionsEndpoint:
    name = "completions"
    summary = "text completions (/v1/completions), streamed or not"
    options: type[BaseModel] = NoOptions
    answer = "text completion chunks (choices[].text)"
    streams = True
    generates = True
    items = ""
    conversation = False
    parts = False
    paths: tuple[str, ...] = ("/v1/completions",)

    def path(self, options: BaseModel) -> str:
        return "/v1/completions"

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        return None

    def batch(self, options: BaseModel) -> int:
        return 1

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        refuse_documents(workload, self.name)
        if any(p.prompt is None for p in (*workload.warmup, *workload.measured)):
            raise ValueError(
                f"dataset: endpoint {self.name!r} sends a text prompt; this dataset gave chat "
                "messages (use endpoint 'chat', or prompts)"
            )
        return workload

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        if prompt.prompt is None:
            raise ValueError("the completions endpoint needs a text prompt, not messages")
        return generation_body(
            {"model": params.model, "prompt": prompt.prompt}, prompt.output_len, params
        )

    def classifier(self, options: BaseModel) -> ClassifyFn:
        return Classifier().classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        return None


COMPLETIONS = CompletionsEndpoint()
