"""Dataset type ``jsonl``: prompts from a JSONL file (``dataset_path``).

One object per line, ``{"prompt": "..."}`` or ``{"messages": [...]}``, optionally
``"output_len": N`` (1 to ``MAX_OUTPUT_LEN``), ``"tools": [...]`` (and ``"tool_choice"``: sent
in the chat request's body, their JSON counted in the prompt), ``"images": ["a.png", ...]``
(files beside the dataset file, confined as it is: image parts of the user message); or,
for the rerank endpoint, a query and the documents it scores:
``{"query": "...", "documents": ["...", ...]}`` (at most ``MAX_DOCUMENTS``; its input
tokens: the query's once for each document, as a cross-encoder reads each pair, plus the
documents'). Blank lines are skipped; anything else is a ``ValueError`` naming the line.
The run records the file's sha256 (``Workload.source``). When the file has fewer prompts
than asked for, it is cycled; warm-ups come from the end of the file, so the measured
prompts do not depend on the warm-up count.
"""

from __future__ import annotations

import json
import os
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
from app.client.datasets.images import MAX_IMAGES_PER_LINE, image_part, read_image


def _parse_line(
    line: str, lineno: int, tok: AnyTokenizer, out_len: int, images: ImageReader | None
) -> Prompt:
    obj = json_object_line(line, lineno, " with 'prompt', 'messages' or 'query'")
    return parse_prompt_line(obj, f"dataset_path line {lineno}", tok, out_len, images)


def image_reader(path: str, dirs: Sequence[str] | None) -> ImageReader:
    """Reads a line's ``images`` (a list of file names, relative to the dataset file's
    directory ``path``'s) as content parts, confined as the dataset file is
    (``images.read_image``); a file named on many lines is read once."""
    base = os.path.dirname(path)
    cache: dict[str, str] = {}

    def read(names: object, where: str) -> list[dict[str, Any]]:
        if not isinstance(names, list) or not names or len(names) > MAX_IMAGES_PER_LINE:
            raise ValueError(f"{where} must be a list of 1 to {MAX_IMAGES_PER_LINE} file names")
        parts = []
        for i, name in enumerate(names):
            key = name if isinstance(name, str) else ""
            if key not in cache or not key:
                cache[key] = read_image(name, f"{where}[{i}]", base, dirs)
            parts.append(image_part(cache[key]))
        return parts

    return read


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


MAX_TOOLS = 128  # tools one line may offer
TOOL_CHOICES = ("none", "auto", "required")
# reads a line's image file names as content parts (``app.client.datasets.images``):
# (the names, the line's place for errors) -> the parts
ImageReader = Callable[[object, str], list[dict[str, Any]]]


def tool_fields(obj: dict[str, Any], where: str, tok: AnyTokenizer) -> tuple[dict[str, Any], int]:
    """A chat line's ``tools`` and ``tool_choice`` (the request body's), and the prompt
    tokens the tools add (their JSON, as a chat template renders them into the prompt)."""
    tools, choice = obj.get("tools"), obj.get("tool_choice")
    if tools is None:
        if choice is not None:
            raise ValueError(f"{where}: 'tool_choice' needs 'tools'")
        return {}, 0
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOLS:
        raise ValueError(f"{where}: 'tools' must be a list of 1 to {MAX_TOOLS} tools")
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(
                f"{where}: each of 'tools' must be an object with 'function': {{'name': ...}}"
            )
    out: dict[str, Any] = {"tools": tools}
    if choice is not None:
        if not (choice in TOOL_CHOICES or isinstance(choice, dict)):
            raise ValueError(
                f"{where}: 'tool_choice' must be one of {', '.join(TOOL_CHOICES)} or an object"
            )
        out["tool_choice"] = choice
    return out, tok.count(json.dumps(tools))


def _with_images(msgs: list[Any], parts: list[dict[str, Any]], where: str) -> list[Any]:
    """The messages with the image parts after the last user message's content."""
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m.get("role") == "user":
            c = m.get("content")
            content = [{"type": "text", "text": c}] if isinstance(c, str) else list(c or [])
            return [*msgs[:i], {**m, "content": content + parts}, *msgs[i + 1 :]]
    raise ValueError(f"{where}: 'images' need a user message to go in")


def parse_prompt_line(
    obj: dict[str, Any],
    where: str,
    tok: AnyTokenizer,
    out_len: int,
    images: ImageReader | None = None,
) -> Prompt:
    """A line's object as a prompt (``where`` names the line in errors). A prompt or
    messages line may carry ``tools`` (and ``tool_choice``), sent in the request's body and
    counted in its prompt, and ``images``: file names, read by ``images`` into the (last)
    user message's content parts."""
    ol = output_len_of(obj, where, out_len)
    if "query" in obj:
        return _query_line(obj, where, tok, ol)
    fields, tool_tokens = tool_fields(obj, where, tok)
    parts: list[dict[str, Any]] = []
    if obj.get("images") is not None:
        if images is None:
            raise ValueError(f"{where}: 'images' are not read by this dataset type")
        parts = images(obj["images"], f"{where}: 'images'")
    if "prompt" in obj:
        p = obj["prompt"]
        if not isinstance(p, str) or not p:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        if not fields and not parts:
            return Prompt(p, None, tok.count(p), ol)
        if not parts:
            return Prompt(p, None, tok.count(p) + tool_tokens, ol, None, fields)
        msgs = [{"role": "user", "content": [{"type": "text", "text": p}, *parts]}]
        return Prompt(None, msgs, tok.count(p) + tool_tokens, ol, None, fields or None, len(parts))
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
            elif isinstance(c, list):
                n_in += sum(
                    tok.count(part["text"])
                    for part in c
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
            elif c is not None:
                raise ValueError(f"{where}: message 'content' must be a string or a list")
        if parts:
            msgs = _with_images(msgs, parts, where)
        return Prompt(None, msgs, n_in + tool_tokens, ol, None, fields or None, len(parts))
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
    images = image_reader(path, dirs)
    for lineno, line in enumerate(open_dataset(path, dirs, digest), start=1):
        check_cancel(cancelled, lineno)
        if line.strip():
            out.append(_parse_line(line, lineno, tok, default_output_len, images))
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
        return Workload(warm, measured, digest.source(), stats=image_stats(measured))


def image_stats(measured: Sequence[Prompt]) -> dict[str, object] | None:
    """``Workload.stats`` of a workload with images: how many its measured prompts carry."""
    n = sum(p.images for p in measured)
    return {"images": n} if n else None


JSONL = JsonlDataset()
