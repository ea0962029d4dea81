"""Surface ``rerank``: a query and its documents in, a relevance score a document out, one
JSON answer a request, never streamed. Its shape is an option (``rerank_api``):

* ``rerank`` (vLLM, Jina): ``POST /v1/rerank`` ``{"model", "query", "documents", "top_n"?}``
  -> ``{"results": [{"index", "relevance_score", "document"?}], "usage": {"total_tokens"}}``;
* ``cohere`` (Cohere v2, also served by vLLM): ``POST /v2/rerank``, the same body ->
  ``{"results": [{"index", "relevance_score"}], "meta": {...}}``;
* ``score`` (vLLM): ``POST /v1/score`` ``{"model", "text_1": query, "text_2": documents}``
  -> ``{"data": [{"index", "score"}], "usage": {"prompt_tokens"}}``;
* ``tei`` (Hugging Face text-embeddings-inference): ``POST /rerank`` ``{"query", "texts"}``
  -> ``[{"index", "score"}]`` (no usage: the client's token count stands).

Each request is one JSONL line's ``query`` and ``documents`` (dataset ``jsonl`` or
``timed_jsonl``). Its answer (``ANSWER``) must score every document (the best ``top_n``
with ``rerank``/``cohere`` when given) and counts the documents scored: the run's
documents/s. E2E latency is the answer's arrival. ``answer_json`` writes each shape (the
simulator answers with it).
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

RerankApi = Literal["rerank", "cohere", "score", "tei"]
API_PATHS: dict[str, str] = {
    "rerank": "/v1/rerank",
    "cohere": "/v2/rerank",
    "score": "/v1/score",
    "tei": "/rerank",
}
DATASETS = ("jsonl", "timed_jsonl")  # the dataset types whose lines carry query + documents
_ANSWERS: dict[str, str] = {
    "rerank": "a rerank answer (results[].relevance_score)",
    "cohere": "a rerank answer (results[].relevance_score)",
    "score": "a score answer (data[].score)",
    "tei": "a TEI rerank answer (a list of {index, score})",
}


class RerankOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rerank_api: RerankApi = Field(
        "rerank",
        description="the API's shape: rerank (vLLM/Jina /v1/rerank), cohere (/v2/rerank), "
        "score (vLLM /v1/score), tei (TEI /rerank)",
    )
    top_n: int | None = Field(
        None, ge=1, le=10_000, description="rerank, cohere: ask for the best N documents only"
    )


def _score(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _rows(obj: Any, api: str) -> list[Any] | None:
    """The scored rows of an answer of shape ``api`` (None: not that shape)."""
    if api == "tei":
        rows = obj if isinstance(obj, list) else None
        key = "score"
    else:
        rows = obj.get("data" if api == "score" else "results") if isinstance(obj, dict) else None
        key = "score" if api == "score" else "relevance_score"
    if not isinstance(rows, list):
        return None
    for row in rows:
        if not isinstance(row, dict) or not _score(row.get(key)):
            return None
        if not isinstance(row.get("index"), int) or isinstance(row.get("index"), bool):
            return None
    return rows


class RerankEndpoint:
    name = "rerank"
    summary = "rerank or score a query's documents (/v1/rerank, /v2/rerank, /v1/score, TEI)"
    options: type[BaseModel] = RerankOptions
    answer = "a rerank answer (results[].relevance_score)"
    streams = False
    generates = False
    conversation = False
    parts = False
    items = "documents"
    paths: tuple[str, ...] = tuple(API_PATHS.values())

    def path(self, options: BaseModel) -> str:
        assert isinstance(options, RerankOptions)
        return API_PATHS[options.rerank_api]

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        assert isinstance(options, RerankOptions)
        if facts.dataset not in DATASETS:
            raise ValueError(
                f"dataset: endpoint 'rerank' scores documents against a query: dataset "
                f"{facts.dataset!r} has no documents; give dataset 'jsonl' with 'query' and "
                "'documents' on each line"
            )
        if options.top_n is not None and options.rerank_api not in ("rerank", "cohere"):
            raise ValueError(
                f"endpoint_options.top_n: rerank_api {options.rerank_api!r} scores every "
                "document; top_n applies to 'rerank' and 'cohere'"
            )

    def batch(self, options: BaseModel) -> int:
        return 1

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        for i, p in enumerate((*workload.measured, *workload.warmup)):
            if p.prompt is None or not p.inputs:
                raise ValueError(
                    "dataset_path: endpoint 'rerank' needs 'query' and 'documents' on every "
                    f"line; request {i + 1} has no documents"
                )
        return workload

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        assert isinstance(options, RerankOptions) and prompt.inputs is not None
        docs = list(prompt.inputs)
        api = options.rerank_api
        body: dict[str, Any]
        if api == "tei":
            body = {"query": prompt.prompt, "texts": docs}
        elif api == "score":
            body = {"model": params.model, "text_1": prompt.prompt, "text_2": docs}
        else:
            body = {"model": params.model, "query": prompt.prompt, "documents": docs}
            if options.top_n is not None:
                body["top_n"] = options.top_n
        if params.extra_body:
            body.update(params.extra_body)
        return dumps(body)

    def classifier(self, options: BaseModel) -> ClassifyFn:
        assert isinstance(options, RerankOptions)
        api = options.rerank_api
        answer = _ANSWERS[api]

        def classify(data: bytes | None) -> Classified:
            obj, other = decode_answer(data, answer)
            if other is not None:
                return other
            rows = _rows(obj, api)
            if rows is None:
                return Classified(EventKind.OTHER, "", None, wrong_shape(answer, data))
            usage = usage_of(obj) if isinstance(obj, dict) else None
            if usage is not None and "prompt_tokens" not in usage and "total_tokens" in usage:
                usage = {"prompt_tokens": usage["total_tokens"]}  # vLLM's rerank: total only
            return Classified(EventKind.ANSWER, "", usage, None, len(rows))

        return classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        assert isinstance(options, RerankOptions)
        docs = len(prompt.inputs or ())
        top = options.top_n if options.rerank_api in ("rerank", "cohere") else None
        return ResultRule(results=min(docs, top) if top else docs, items=docs)


def answer_json(
    api: str,
    scores: Sequence[float],
    documents: Sequence[str],
    *,
    model: str,
    tokens: int,
    top_n: int | None = None,
) -> Any:
    """An answer of shape ``api`` scoring ``documents`` (rerank, cohere, tei: best first, the
    first ``top_n`` of them; score: in the documents' order)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or len(scores)]
    if api == "tei":
        return [{"index": i, "score": scores[i]} for i in order]
    if api == "score":
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"id": "score-sim", "object": "list", "model": model, "data": data, "usage": usage}
    if api == "cohere":
        ranked = [{"index": i, "relevance_score": scores[i]} for i in order]
        return {
            "id": "rerank-sim",
            "results": ranked,
            "meta": {"billed_units": {"search_units": 1}},
        }
    results: list[dict[str, Any]] = [
        {"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]}
        for i in order
    ]
    return {
        "id": "rerank-sim",
        "model": model,
        "usage": {"total_tokens": tokens},
        "results": results,
    }


RERANK = RerankEndpoint()
