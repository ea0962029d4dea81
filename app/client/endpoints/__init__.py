"""API surfaces, found by name (``ENDPOINTS``): each is one module implementing
``EndpointType`` (``base.py``): its path, its request body, what each event of its answer
is, the answer a non-streaming surface must give, and its own spec fields (``options``,
given in ``RunSpec.endpoint_options``).

Adding a surface: a module here (with its tests), its line in ``ENDPOINTS`` and its handler
in the simulator (``app.targets.simulator.surfaces``); the CLI's ``--endpoint`` and option
flags, the API schema and the launch forms read this registry.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from app.client.endpoints.anthropic_messages import ANTHROPIC_MESSAGES
from app.client.endpoints.base import EndpointType
from app.client.endpoints.chat import CHAT
from app.client.endpoints.completions import COMPLETIONS
from app.client.endpoints.embeddings import EMBEDDINGS
from app.client.endpoints.rerank import RERANK
from app.client.endpoints.responses import RESPONSES

ENDPOINTS: dict[str, EndpointType] = {
    e.name: e for e in (CHAT, COMPLETIONS, EMBEDDINGS, RERANK, RESPONSES, ANTHROPIC_MESSAGES)
}
# the paths of the OpenAI surfaces, accepted as --endpoint values (vLLM's flag takes them)
PATH_ALIASES: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/rerank": "rerank",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic-messages",
}


# the run spec's field descriptions (the API schema and the CLI's help)
ENDPOINT_HELP = "an API surface: " + "; ".join(f"{k}: {e.summary}" for k, e in ENDPOINTS.items())
ENDPOINT_OPTIONS_HELP = (
    "the endpoint's own fields, by name ("
    + "; ".join(
        f"{k}: {', '.join(e.options.model_fields)}"
        for k, e in ENDPOINTS.items()
        if e.options.model_fields
    )
    + "); another endpoint's or an unknown field is refused (422 naming "
    "endpoint_options.<field>); see docs/endpoints.md"
)


def endpoint_type(name: str) -> EndpointType:
    """The registered surface ``name`` (a ``ValueError`` lists the known ones)."""
    try:
        return ENDPOINTS[name]
    except KeyError:
        known = ", ".join(ENDPOINTS)
        raise ValueError(f"endpoint: unknown endpoint {name!r} (one of: {known})") from None


def parse_endpoint_options(kind: EndpointType, raw: dict[str, Any]) -> BaseModel:
    """``raw`` as the surface's options; a ``ValueError`` names the first bad field as
    ``endpoint_options.<field>``."""
    try:
        return kind.options.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        field = f"endpoint_options.{where}" if where else "endpoint_options"
        raise ValueError(f"{field}: {err.get('msg')} (endpoint {kind.name!r})") from None


def items_noun(endpoint: object) -> str:
    """What a run's answers carry, plural, for its items/s ("inputs", "documents"): the
    surface's own noun, else "items"."""
    kind = ENDPOINTS.get(str(endpoint))
    return kind.items if kind is not None and kind.items else "items"
