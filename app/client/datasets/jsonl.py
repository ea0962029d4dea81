"""Dataset type ``jsonl``: prompts from a JSONL file (``dataset_path``).

One object per line, ``{"prompt": "..."}`` or ``{"messages": [...]}``, optionally
``"output_len": N`` (1 to ``MAX_OUTPUT_LEN``); or, for the rerank endpoint, a query and the
documents it scores: ``{"query": "...", "documents": ["...", ...]}`` (at most
``MAX_DOCUMENTS``; its input tokens: the query's once for each document, as a cross-encoder
reads each pair, plus the documents'). Blank lines are skipped; anything else is a
``ValueError`` naming the line. The run records the file's sha256 (``Workload.source``).
When the file has fewer prompts than asked for, it is cycled; warm-ups come from the end of
the file, so the measured prompts do not depend on the warm-up count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from app.client.datasets.base import (
    MAX_OUTPUT_LEN,
    AnyTokenizer,
    BuildContext,
    FileDigest,
    NoOptions,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
    json_object_line,
    open_dataset,
)


def _parse_line(line: str, lineno: int, tok: AnyTokenizer, out_len: int) -> Prompt:
    obj = json_object_line(line, lineno, " with 'prompt', 'messages' or 'query'")
    return parse_prompt_line(obj, f"dataset_path line {lineno}", tok, out_len)


def output_len_of(obj: dict[str, Any], where: str, default: int) -> int:
    """A line's ``output_len``: an integer in [1, ``MAX_OUTPUT_LEN``] (``default`` if absent)."""
    ol = obj.get("output_len", default)
    if not isinstance(ol, int) or isinstance(ol, bool) or ol < 1:
        raise ValueError(f"{where}: 'output_len' must be a positive integer")
    if ol > MAX_OUTPUT_LEN:
        raise ValueError(f"{where}: 'output_len' is over {MAX_OUTPUT_LEN:,} tokens")
    return ol


MAX_DOCUMENTS = 10_000  # documents one rerank line may carry


def _query_line(obj: dict[str, Any], where: str, tok: AnyTokenizer, out_len: int) -> Prompt:
    query, docs = obj["query"], obj.get("documents")
    if not isinstance(query, str) or not query:
        raise ValueError(f"{where}: 'query' must be a non-empty string")
    if not isinstance(docs, list) or not docs or len(docs) > MAX_DOCUMENTS:
        raise ValueError(
            f"{where}: 'documents' must be a list of 1 to {MAX_DOCUMENTS:,} strings beside 'query'"
        )
    if not all(isinstance(d, str) and d for d in docs):
        raise ValueError(f"{where}: each of 'documents' must be a non-empty string")
    n_in = tok.count(query) * len(docs) + sum(tok.count(d) for d in docs)
    return Prompt(query, None, n_in, out_len, tuple(docs))


def parse_prompt_line(obj: dict[str, Any], where: str, tok: AnyTokenizer, out_len: int) -> Prompt:
    """A line's object as a prompt (``where`` names the line in errors)."""
    ol = output_len_of(obj, where, out_len)
    if "query" in obj:
        return _query_line(obj, where, tok, ol)
    if "prompt" in obj:
        p = obj["prompt"]
        if not isinstance(p, str) or not p:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(p, None, tok.count(p), ol)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{where}: 'messages' must be a non-empty list")
        n_in = 0
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"{where}: each message needs a 'role' and 'content'")
            c = m.get("content")
            if isinstance(c, str):
                n_in += tok.count(c)
            elif c is not None and not isinstance(c, list):
                raise ValueError(f"{where}: message 'content' must be a string or a list")
        return Prompt(None, msgs, n_in, ol)
    raise ValueError(f"{where}: expected a 'prompt', 'messages' or 'query' key")


def load_jsonl(
    path: str,
    tok: AnyTokenizer,
    default_output_len: int,
    *,
    dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
    digest: Callable[[bytes], None] | None = None,
) -> list[Prompt]:
    out: list[Prompt] = []
    for lineno, line in enumerate(open_dataset(path, dirs, digest), start=1):
        check_cancel(cancelled, lineno)
        if line.strip():
            out.append(_parse_line(line, lineno, tok, default_output_len))
    if not out:
        raise ValueError("dataset_path: no prompts in the file")
    return out


class JsonlDataset:
    name = "jsonl"
    summary = (
        "prompts, chat messages, or a query and its documents (rerank) from a JSONL file "
        "(dataset_path)"
    )
    options: type[BaseModel] = NoOptions
    timed = False

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError("dataset_path is required when dataset is 'jsonl'")

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded by the file's size (MAX_DATASET_BYTES)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert params.dataset_path is not None
        digest = FileDigest()
        items = load_jsonl(
            params.dataset_path,
            ctx.tokenizer,
            params.output_len,
            dirs=ctx.dataset_dirs,
            cancelled=ctx.cancelled,
            digest=digest.update,
        )
        measured = [items[i % len(items)] for i in range(params.prompts)]
        warm = [items[-1 - (i % len(items))] for i in range(params.warmup_requests)]
        return Workload(warm, measured, digest.source())


JSONL = JsonlDataset()
