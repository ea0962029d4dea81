"""Surface ``embeddings``: OpenAI's ``POST /v1/embeddings`` (vLLM, llama.cpp's embeddings
mode, TEI's OpenAI route), one JSON answer a request, never streamed.

Body: ``model``, ``input`` (a list of ``batch_size`` texts: the dataset's text prompts, in
order), ``encoding_format`` and, when given, ``dimensions``; then ``extra_body``. The answer
must be ``{"data": [{"embedding": [...] | "<base64>", "index": i}, ...], "usage": {...}}``
with one embedding per input, all of one length: its event (``ANSWER``) counts the inputs
embedded; usage's ``prompt_tokens`` is the request's input tokens. E2E latency is the
answer's arrival; TTFT, ITL and TPOT do not apply. ``answer_json`` is the answer's wire
shape (the simulator answers with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.client.datasets.base import Prompt, Workload
from app.client.endpoints.base import (
    BodyParams,
    ClassifyFn,
    ResultRule,
    SpecFacts,
    decode_answer,
    dumps,
    usage_of,
    wrong_shape,
)
from app.client.events import Classified
from app.domain import EventKind

MAX_BATCH = 4096  # inputs one request carries at most


class EmbeddingsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(
        1, ge=1, le=MAX_BATCH, description="inputs per request (num_prompts counts requests)"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="the embeddings' encoding in the answer"
    )
    dimensions: int | None = Field(
        None, ge=1, le=65_536, description="ask for shortened embeddings (models that can)"
    )


def _group(prompts: Sequence[Prompt], n: int, what: str) -> list[Prompt]:
    out: list[Prompt] = []
    for i in range(0, len(prompts) - n + 1, n):
        batch = prompts[i : i + n]
        texts: list[str] = []
        for p in batch:
            if p.prompt is None or p.inputs is not None:
                raise ValueError(
                    f"dataset: endpoint 'embeddings' embeds text prompts; {what} {i + 1} of "
                    "the dataset is chat messages or query + documents"
                )
            texts.append(p.prompt)
        out.append(Prompt(None, None, sum(p.input_tokens for p in batch), 0, tuple(texts)))
    return out


class EmbeddingsEndpoint:
    name = "embeddings"
    summary = "embeddings (/v1/embeddings): batch_size text inputs a request, one JSON answer"
    options: type[BaseModel] = EmbeddingsOptions
    answer = "an embeddings answer (data[].embedding)"
    streams = False
    generates = False
    conversation = False
    parts = False
    items = "inputs"
    paths: tuple[str, ...] = ("/v1/embeddings",)

    def path(self, options: BaseModel) -> str:
        return self.paths[0]

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        assert isinstance(options, EmbeddingsOptions)
        if facts.timed and options.batch_size > 1:
            raise ValueError(
                f"endpoint_options.batch_size: dataset {facts.dataset!r} gives each line its "
                "own send time: batch_size must be 1"
            )

    def batch(self, options: BaseModel) -> int:
        assert isinstance(options, EmbeddingsOptions)
        return options.batch_size

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        n = self.batch(options)
        return Workload(
            _group(workload.warmup, n, "warm-up prompt"),
            _group(workload.measured, n, "prompt"),
            workload.source,
            workload.at_ns,
            workload.stats,
        )

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        assert isinstance(options, EmbeddingsOptions) and prompt.inputs is not None
        body: dict[str, Any] = {
            "model": params.model,
            "input": list(prompt.inputs),
            "encoding_format": options.encoding_format,
        }
        if options.dimensions is not None:
            body["dimensions"] = options.dimensions
        if params.extra_body:
            body.update(params.extra_body)
        return dumps(body)

    def classifier(self, options: BaseModel) -> ClassifyFn:
        return self.classify

    def classify(self, data: bytes | None) -> Classified:
        obj, other = decode_answer(data, self.answer)
        if other is not None:
            return other
        items = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(items, list):
            return Classified(EventKind.OTHER, "", None, wrong_shape(self.answer, data))
        shapes: set[tuple[type, int]] = set()  # (list or base64 str, its length)
        for item in items:
            emb = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(emb, list | str) or not emb:
                why = "the embeddings answer holds an item without an embedding"
                return Classified(EventKind.OTHER, "", None, why)
            shapes.add((type(emb), len(emb)))
        if len(shapes) > 1:
            why = "the embeddings answer holds embeddings of different lengths"
            return Classified(EventKind.OTHER, "", None, why)
        return Classified(EventKind.ANSWER, "", usage_of(obj), None, len(items))

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        n = len(prompt.inputs or ())
        return ResultRule(results=n, items=n)


def answer_json(
    vectors: Sequence[list[float] | str], model: str, prompt_tokens: int
) -> dict[str, Any]:
    """An embeddings answer as OpenAI's API writes it (float lists, or base64 strings)."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


EMBEDDINGS = EmbeddingsEndpoint()
