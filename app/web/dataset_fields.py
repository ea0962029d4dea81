"""The launch forms' fields for each dataset type's own options, generated from the
registry's option models (``app.client.datasets.DATASETS``): one group per type, each field
named ``opt-<type>-<option>`` with its label, help (the field's description) and, for
numbers, min/max/step from the model's constraints. Only the chosen type's group is read
(static/dataset-options.js shows only that group; without JS every group shows)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from app.client.datasets import DATASETS

PREFIX = "opt"


@dataclass(frozen=True, slots=True)
class OptionField:
    name: str  # the form input's name, opt-<type>-<option>
    option: str  # its key in dataset_options
    label: str
    kind: str  # number | checkbox | select | text
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: str = ""
    maximum: str = ""
    step: str = ""  # number inputs: "1" (integers) or "any"
    default: Any = None
    required: bool = False


@dataclass(frozen=True, slots=True)
class DatasetGroup:
    dataset: str
    summary: str
    fields: tuple[OptionField, ...]


def option_name(dataset: str, option: str) -> str:
    return f"{PREFIX}-{dataset}-{option}"


def _plain(annotation: Any) -> Any:
    """``int | None`` -> ``int`` (an optional option: blank is its default)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def _bounds(info: FieldInfo) -> tuple[str, str]:
    """HTML min/max from the field's constraints (exclusive bounds as their limit: the
    server's check is the exact one)."""
    low = high = ""
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = f"{m.ge}"
        elif isinstance(m, annotated_types.Gt):
            low = f"{m.gt}"
        elif isinstance(m, annotated_types.Le):
            high = f"{m.le}"
        elif isinstance(m, annotated_types.Lt):
            high = f"{m.lt}"
    return low, high


def option_field(
    dataset: str, option: str, info: FieldInfo, *, prefix: str = PREFIX
) -> OptionField:
    """The form input of one option of an options model (``prefix``: ``opt`` for a dataset
    type's, ``eopt`` for an endpoint's, ``app.web.endpoint_fields``)."""
    plain = _plain(info.annotation)
    label = option.replace("_", " ").capitalize()
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    help_ = info.description or ""
    if default is None and not info.is_required():
        help_ = f"{help_}; blank: the default" if help_ else "blank: the default"
    common: dict[str, Any] = {
        "name": f"{prefix}-{dataset}-{option}",
        "option": option,
        "label": label,
        "help": help_,
        "default": default,
    }
    if plain is bool:
        return OptionField(kind="checkbox", **common)
    if typing.get_origin(plain) is Literal:
        choices = tuple(str(c) for c in typing.get_args(plain))
        return OptionField(kind="select", choices=("", *choices), **common)
    if plain in (int, float):
        low, high = _bounds(info)
        step = "1" if plain is int else "any"
        return OptionField(kind="number", minimum=low, maximum=high, step=step, **common)
    return OptionField(kind="text", **common)


def dataset_groups() -> tuple[DatasetGroup, ...]:
    return tuple(
        DatasetGroup(
            dataset=name,
            summary=kind.summary,
            fields=tuple(
                option_field(name, option, info)
                for option, info in kind.options.model_fields.items()
            ),
        )
        for name, kind in DATASETS.items()
    )


GROUPS: tuple[DatasetGroup, ...] = dataset_groups()
BY_DATASET: dict[str, DatasetGroup] = {g.dataset: g for g in GROUPS}
NAMES = frozenset(f.name for g in GROUPS for f in g.fields)


def options_of(form: dict[str, str]) -> dict[str, Any]:
    """The chosen dataset type's option fields of a form as ``dataset_options`` (blank
    fields left out: the type's default); other types' fields are ignored."""
    group = BY_DATASET.get((form.get("dataset") or "").strip())
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


def field_of_error(dataset: str, key: str) -> str | None:
    """``dataset_options.<option>`` (an error's field) -> the form input of that option of
    ``dataset``, if it has one."""
    option = key.removeprefix("dataset_options.")
    group = BY_DATASET.get(dataset)
    if group is None or option == key:
        return None
    for f in group.fields:
        if f.option == option:
            return f.name
    return None
