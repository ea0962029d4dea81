"""The simulator's ``embeddings`` surface: ``input`` (a string, strings, token ids or lists of
them) in, one answer out in the client module's wire shape (``answer_json``): an embedding
per input of ``dimensions`` (else the config's ``embedding_dim``) floats, seeded by the
seed and the input, as float lists or base64 (``encoding_format``)."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

from app.client.endpoints.embeddings import EMBEDDINGS, answer_json
from app.targets.sim_config import SimConfig
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import BadRequest, Plan, count_prompt, int_field

MAX_INPUTS = 65_536


def _inputs(raw: object) -> list[object]:
    """The inputs of ``input``: one string or token-id list, or a list of them."""
    if isinstance(raw, str) and raw:
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        return [raw]
    if isinstance(raw, list) and raw and len(raw) <= MAX_INPUTS:
        for x in raw:
            if not (isinstance(x, str) or (isinstance(x, list) and x)):
                break
        else:
            return list(raw)
    raise BadRequest("'input' must be a non-empty string, list of strings or of token ids")


def vector(seed: int, text: object, dim: int) -> list[float]:
    """A deterministic embedding of ``text`` (6 decimals, in [-1, 1)): ``dim`` 32-bit draws
    of one SHAKE-128 digest of the seed and the input (a seeded ``random.Random`` per input
    cost twice the time: the simulator answers thousands of these a second)."""
    raw = hashlib.shake_128(repr((seed, "embedding", text)).encode()).digest(4 * dim)
    return [round(x / 2147483648.0 - 1.0, 6) for x in struct.unpack(f"<{dim}I", raw)]


class EmbeddingsSurface:
    endpoint = EMBEDDINGS.name

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        inputs = _inputs(body.get("input"))
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be 'float' or 'base64'")
        dim = int_field(body, "dimensions", config.embedding_dim) or config.embedding_dim
        if not 1 <= dim <= 65_536:
            raise BadRequest("'dimensions' must be in 1..65536")
        tokens = sum(count_prompt(x) for x in inputs)
        model = body.get("model")
        model = model if isinstance(model, str) and model else config.model
        vectors: list[list[float] | str] = []
        for x in inputs:
            v = vector(config.seed, x, dim)
            if encoding == "base64":
                vectors.append(base64.b64encode(struct.pack(f"<{dim}f", *v)).decode())
            else:
                vectors.append(v)
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
            items=len(inputs),
            answer=json_bytes(answer_json(vectors, model, tokens)),
        )

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        return None


EMBEDDINGS_SURFACE = EmbeddingsSurface()
