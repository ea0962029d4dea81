"""Request bodies and paths as a run builds them (``app.client.endpoints``), for tests that
drive ``StreamRequest`` by hand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.client.datasets.base import Prompt
from app.client.endpoints import endpoint_type
from app.client.endpoints.base import BodyParams
from app.client.http_request import Target


def body_of(
    endpoint: str = "chat",
    *,
    model: str = "m",
    prompt: str | None = "hello",
    messages: list[dict[str, Any]] | None = None,
    output_len: int = 5,
    ignore_eos: bool = True,
    extra_body: Mapping[str, object] | None = None,
    stream: bool = True,
    options: dict[str, Any] | None = None,
    inputs: tuple[str, ...] | None = None,
) -> bytes:
    kind = endpoint_type(endpoint)
    opts = kind.options.model_validate(options or {})
    params = BodyParams(model, ignore_eos, stream, dict(extra_body or {}))
    return kind.body(Prompt(prompt, messages, 0, output_len, inputs), params, opts)


def path_of(target: Target, endpoint: str = "chat", options: dict[str, Any] | None = None) -> str:
    kind = endpoint_type(endpoint)
    return target.url_path(kind.path(kind.options.model_validate(options or {})))
