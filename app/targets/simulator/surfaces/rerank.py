"""The simulator's ``rerank`` surface: every shape of the client's rerank module, chosen by
the request's path (``API_PATHS``): a query and its documents in (``query`` + ``documents``,
``text_1`` + ``text_2``, TEI's ``query`` + ``texts``), a seeded relevance score a document
out, written in that shape by the module's ``answer_json``. Its input tokens: the query's
once for each document (each pair, as a cross-encoder reads it) plus the documents'."""

from __future__ import annotations

from typing import Any

from app.client.endpoints.rerank import API_PATHS, RERANK, answer_json
from app.targets.sim_config import SimConfig
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import BadRequest, Plan, count_tokens, int_field, unit

API_OF_PATH = {path: api for api, path in API_PATHS.items()}
MAX_DOCUMENTS = 100_000


def _documents(raw: object, name: str) -> list[str]:
    if isinstance(raw, str) and raw:
        return [raw]
    if (
        isinstance(raw, list)
        and 0 < len(raw) <= MAX_DOCUMENTS
        and all(isinstance(d, str) for d in raw)
    ):
        return list(raw)
    raise BadRequest(f"'{name}' must be a string or a non-empty list of strings")


class RerankSurface:
    endpoint = RERANK.name

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        api = API_OF_PATH[path]
        query_key, docs_key = {"score": ("text_1", "text_2"), "tei": ("query", "texts")}.get(
            api, ("query", "documents")
        )
        query = body.get(query_key)
        if not isinstance(query, str) or not query:
            raise BadRequest(f"'{query_key}' must be a non-empty string")
        docs = _documents(body.get(docs_key), docs_key)
        top_n = int_field(body, "top_n", None) if api in ("rerank", "cohere") else None
        if top_n is not None and top_n < 1:
            raise BadRequest("'top_n' must be >= 1")
        q = count_tokens(query)
        tokens = q * len(docs) + sum(count_tokens(d) for d in docs)
        scores = [round(unit(config.seed, "score", query, d), 6) for d in docs]
        model = body.get("model")
        model = model if isinstance(model, str) and model else config.model
        answer = answer_json(api, scores, docs, model=model, tokens=tokens, top_n=top_n)
        return Plan(
            endpoint=self.endpoint,
            stream=False,
            model=model,
            input_tokens=tokens,
            output_tokens=0,
            reasoning_tokens=0,
            finish_reason="stop",
            include_usage=True,
            text_seed="",
            path=path,
            items=len(docs),
            answer=json_bytes(answer),
        )

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        return None


RERANK_SURFACE = RerankSurface()
