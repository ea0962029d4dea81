"""The launch forms' fields for each endpoint's own options, generated from the registry's
option models (``app.client.endpoints.ENDPOINTS``), as ``app.web.dataset_fields`` does for
dataset types: one group per surface, each field named ``eopt-<endpoint>-<option>``. Only
the chosen surface's group is read (static/dataset-options.js shows only that group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.client.endpoints import ENDPOINTS
from app.web.dataset_fields import OptionField, option_field

PREFIX = "eopt"


@dataclass(frozen=True, slots=True)
class EndpointGroup:
    endpoint: str
    summary: str
    fields: tuple[OptionField, ...]


def option_name(endpoint: str, option: str) -> str:
    return f"{PREFIX}-{endpoint}-{option}"


def endpoint_groups() -> tuple[EndpointGroup, ...]:
    return tuple(
        EndpointGroup(
            endpoint=name,
            summary=kind.summary,
            fields=tuple(
                option_field(name, option, info, prefix=PREFIX)
                for option, info in kind.options.model_fields.items()
            ),
        )
        for name, kind in ENDPOINTS.items()
    )


GROUPS: tuple[EndpointGroup, ...] = endpoint_groups()
BY_ENDPOINT: dict[str, EndpointGroup] = {g.endpoint: g for g in GROUPS}
NAMES = frozenset(f.name for g in GROUPS for f in g.fields)


def options_of(form: dict[str, str]) -> dict[str, Any]:
    """The chosen endpoint's option fields of a form as ``endpoint_options`` (blank fields
    left out: the surface's default); other surfaces' fields are ignored."""
    group = BY_ENDPOINT.get((form.get("endpoint") or "").strip())
    out: dict[str, Any] = {}
    if group is None:
        return out
    for f in group.fields:
        raw = (form.get(f.name) or "").strip()
        if f.kind == "checkbox":
            out[f.option] = raw not in ("", "0", "false", "off")
        elif raw:
            out[f.option] = raw
    return out


def field_of_error(endpoint: str, key: str) -> str | None:
    """``endpoint_options.<option>`` (an error's field) -> the form input of that option of
    ``endpoint``, if it has one."""
    option = key.removeprefix("endpoint_options.")
    group = BY_ENDPOINT.get(endpoint)
    if group is None or option == key:
        return None
    for f in group.fields:
        if f.option == option:
            return f.name
    return None
