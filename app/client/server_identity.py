"""The engine's identity, captured into the run before its load: ``GET /version``, ``GET
/server_info`` (vLLM, newer SGLang) or else ``GET /get_server_info`` (older SGLang), and the
requested model's ``max_model_len`` from ``/v1/models`` (``served_models``). Each answer is
a target's, so hostile until bounded: at most ``MAX_BYTES`` in ``TIMEOUT_S``
(``app.client.bounded_get``), and what is kept of its JSON is flat: at most ``MAX_KEYS``
scalar leaves, ``MAX_DEPTH`` levels down, keys of at most ``MAX_KEY_CHARS`` and strings of at
most ``MAX_TEXT_CHARS`` characters, control characters (NUL included) removed. A missing
answer is recorded (``unavailable``: path -> why), never fatal.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from app.client.bounded_get import get_bounded
from app.client.spec import RunSpec
from app.client.target_keys import key_may_reach

STATS_KEY = "server_identity"
TIMEOUT_S = 2.0
MAX_BYTES = 256 << 10
MAX_KEYS = 64
MAX_DEPTH = 3
MAX_KEY_CHARS = 100
MAX_TEXT_CHARS = 300
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
INFO_PATHS = ("/server_info", "/get_server_info")


def clean_text(value: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``value`` without control characters (NUL included), cut at ``limit`` characters."""
    out = _CONTROL.sub("", value[: limit * 2])
    return out if len(out) <= limit else out[: limit - 1] + "…"


def flatten(obj: Any, *, max_keys: int = MAX_KEYS) -> dict[str, Any]:
    """Scalar leaves of a JSON value as ``{"a.b": leaf}``: at most ``max_keys``, ``MAX_DEPTH``
    levels down (deeper objects and lists are skipped), strings cleaned (``clean_text``)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str, depth: int) -> None:
        if len(out) >= max_keys:
            return
        if isinstance(node, dict):
            if depth >= MAX_DEPTH:
                return
            for k, v in node.items():
                key = clean_text(str(k), MAX_KEY_CHARS)
                walk(v, f"{prefix}.{key}" if prefix else key, depth + 1)
                if len(out) >= max_keys:
                    return
        elif isinstance(node, list):
            return  # lists (of devices, of models) are not an identity's scalars
        elif isinstance(node, str):
            out[prefix or "value"] = clean_text(node)
        elif node is None or isinstance(node, bool | int):
            out[prefix or "value"] = (
                node if not isinstance(node, int) or abs(node) < 2**53 else str(node)
            )
        elif isinstance(node, float):
            out[prefix or "value"] = node if node == node and abs(node) != float("inf") else None

    walk(obj, "", 0)
    return out


def control_base(base_url: str) -> str:
    """Where an engine's own routes live: ``base_url`` less a trailing ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def auth_headers(spec: RunSpec, url: str) -> dict[str, str]:
    """The run's key, where it may go (``key_may_reach``)."""
    if spec.api_key and key_may_reach(spec, url):
        return {"Authorization": f"Bearer {spec.api_key}"}
    return {}


def _read(client: httpx.Client, spec: RunSpec, url: str) -> tuple[Any, str | None]:
    """(JSON answer, None), or (None, why not)."""
    try:
        ans = get_bounded(client, url, max_bytes=MAX_BYTES, deadline_s=TIMEOUT_S)
    except httpx.HTTPError as e:
        return None, type(e).__name__
    if ans.status != 200:
        return None, f"HTTP {ans.status}"
    if ans.body is None:
        return None, f"not read: {ans.error}"
    try:
        return json.loads(ans.body), None
    except (ValueError, RecursionError):
        text = ans.body[:MAX_TEXT_CHARS].decode("utf-8", "replace").strip()
        return (clean_text(text) if text else None), (None if text else "empty answer")


def fetch(
    spec: RunSpec, *, max_model_len: int | None = None, base_url: str | None = None
) -> dict[str, Any]:
    """The identity block of the run's load statistics (``STATS_KEY``) of its target
    (``base_url``: one of a run's several targets, else ``spec.base_url``)."""
    base = control_base(base_url or spec.base_url)
    out: dict[str, Any] = {"version": None, "server_info": None, "max_model_len": max_model_len}
    missing: dict[str, str] = {}
    headers = auth_headers(spec, base + "/version")
    with httpx.Client(headers=headers, timeout=TIMEOUT_S, trust_env=False) as client:
        body, why = _read(client, spec, base + "/version")
        if why is not None:
            missing["/version"] = why
        elif isinstance(body, dict):
            v = body.get("version")
            out["version"] = clean_text(str(v)) if v is not None else None
            if out["version"] is None:
                missing["/version"] = "no 'version' in the answer"
        elif isinstance(body, str | int | float):  # a bare JSON string or number, or text
            out["version"] = clean_text(str(body))
        for path in INFO_PATHS:
            body, why = _read(client, spec, base + path)
            if why is None and isinstance(body, dict):
                out["server_info"] = flatten(body)
                out["server_info_path"] = path
                break
            missing[path] = why or "not a JSON object"
    if out["server_info"] is not None:
        missing = {k: v for k, v in missing.items() if k not in INFO_PATHS}
    if missing:
        out["unavailable"] = missing
    return out
