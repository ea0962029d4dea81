"""Which models the target serves: ``GET /v1/models`` once at the start of a run (short
timeout), recorded in the run's load statistics (``served_models``), with a validity warning
when the requested model is not among them. A failed fetch is noted, never fatal: many
servers answer any model name, and some have no ``/v1/models``.

The answer is bounded like every answer of a target (``app.client.bounded_get``): at most
``MAX_BYTES`` in ``TIMEOUT_S``, and at most ``MAX_IDS`` ids of at most ``MAX_ID_CHARS``
characters are kept (a model id is what a benchmark needs, not a list from any service)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from app.client.bounded_get import get_bounded
from app.client.endpoints.base import surface_headers
from app.client.spec import RunSpec

TIMEOUT_S = 2.0
STATS_KEY = "served_models"
MAX_BYTES = 1 << 20
MAX_IDS = 64
MAX_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class ServedModels:
    url: str
    ids: list[str] | None  # None: could not be listed
    error: str | None = None
    max_model_len: dict[str, int] | None = None  # model id -> its context length, where listed


def models_url(base_url: str) -> str:
    """``base_url`` + ``/v1/models`` (a base ending in ``/v1`` is not doubled)."""
    return base_url.rstrip("/").removesuffix("/v1") + "/v1/models"


def parse_models(body: Any) -> list[str]:
    """Model ids of an OpenAI-style list (``{"data": [{"id": ...}]}``; llama.cpp also sends
    ``"models": [{"model"|"name": ...}]``). Raises ValueError when there is no such list."""
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    ids: list[str] = []
    data = body.get("data")
    if isinstance(data, list):
        ids += [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id") is not None]
    elif not isinstance(body.get("models"), list):
        raise ValueError("the answer has no 'data' list")
    for m in body.get("models") or []:
        if isinstance(m, dict):
            name = m.get("model") or m.get("name")
            if name is not None and str(name) not in ids:
                ids.append(str(name))
    return [i[:MAX_ID_CHARS] for i in ids[:MAX_IDS]]


def model_lengths(body: Any) -> dict[str, int]:
    """Each listed model's ``max_model_len`` (vLLM lists it), a positive int below 2^53."""
    out: dict[str, int] = {}
    data = body.get("data") if isinstance(body, dict) else None
    for m in data if isinstance(data, list) else []:
        if not isinstance(m, dict) or m.get("id") is None or len(out) >= MAX_IDS:
            continue
        n = m.get("max_model_len")
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**53:
            out[str(m["id"])[:MAX_ID_CHARS]] = n
    return out


def fetch(
    spec: RunSpec, *, timeout_s: float = TIMEOUT_S, base_url: str | None = None
) -> ServedModels:
    """GET the target's model list (``base_url``: one of a run's several targets, else
    ``spec.base_url``); any failure is returned as ``error``."""
    url = models_url(base_url or spec.base_url)
    kind, options = spec.surface()
    own, key_header = surface_headers(kind, options)
    headers = dict(own)
    if spec.api_key:
        headers[key_header or "Authorization"] = (
            spec.api_key if key_header else f"Bearer {spec.api_key}"
        )
    try:
        with httpx.Client(headers=headers, timeout=timeout_s, trust_env=False) as client:
            ans = get_bounded(client, url, max_bytes=MAX_BYTES, deadline_s=timeout_s)
    except httpx.HTTPError as e:
        return ServedModels(url, None, f"{type(e).__name__}")
    if ans.status != 200:
        return ServedModels(url, None, f"HTTP {ans.status}")
    if ans.body is None:
        return ServedModels(url, None, f"not read: {ans.error}")
    try:
        body = json.loads(ans.body)
        return ServedModels(url, parse_models(body), max_model_len=model_lengths(body))
    except (ValueError, RecursionError) as e:
        return ServedModels(url, None, f"not a model list ({e})")


def warning(model: str, served: ServedModels, target: str | None = None) -> str | None:
    """The validity note for a requested model the server does not list, or a failed fetch
    (``target``: one of a run's several targets, named in the note)."""
    server = "the server" if target is None else target
    if served.ids is None:
        return (
            f"could not list the served models (GET {served.url}: {served.error}): "
            f"whether the server serves {model!r} is unchecked"
        )
    if model in served.ids:
        return None
    listed = ", ".join(repr(m) for m in served.ids) if served.ids else "no model"
    return (
        f"the requested model {model!r} is not among the models {server} lists "
        f"({listed}): the figures may be of another model"
    )


def record(
    load_stats: dict[str, Any], validity: list[str], model: str, served: ServedModels
) -> None:
    """``served_models`` into the load statistics; the warning, if any, into validity."""
    load_stats[STATS_KEY] = served.ids
    if served.ids is None:
        load_stats["served_models_error"] = served.error
    note = warning(model, served)
    if note is not None:
        validity.append(note)
