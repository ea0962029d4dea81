"""NUL (U+0000) in strings that come in: the one rule and its check. Pure.

PostgreSQL's ``text`` cannot hold U+0000, so a NUL that reached a text column was a 500
there (SQLite stored it). Two kinds of strings, two rules (docs/api.md, "Text"):

- **What a user or a worker says about itself** -- a JSON body, a form, a path or query, an
  import file; a worker's hostname, name, client host and version -- is refused with a 4xx
  naming the field, before anything changes. Input models inherit ``NoNul`` (every field,
  nested values and keys included); other strings go through ``find_nul``; a path or query
  is refused by ``app.api.hardening.NulGuard``.
- **What a target said** (an error message, a ``/metrics`` label value), which no user can
  correct, is stored faithfully: ``app.storage.target_text`` escapes the NUL reversibly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator

NUL = "\x00"
NUL_REFUSED = "contains a NUL character (U+0000), which cannot be stored"


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    shown = str(key).replace(NUL, "\\x00")
    return f"{path}.{shown}" if path else shown


def find_nul(value: Any) -> str | None:
    """Where the first string of ``value`` that holds a NUL is: ``""`` for ``value`` itself,
    else a path such as ``x.y[2]`` (a mapping's keys are checked too); None when no string
    holds one. Walks without recursion, so any nesting is safe."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if NUL in v:
                return path
            continue
        items: list[tuple[str, Any]] = []
        if isinstance(v, BaseModel):
            items = [(_join(path, k), getattr(v, k)) for k in type(v).model_fields]
        elif isinstance(v, Mapping):
            for k, x in v.items():
                if isinstance(k, str) and NUL in k:
                    return _join(path, k)
                items.append((_join(path, k), x))
        elif isinstance(v, list | tuple | set | frozenset):
            items = [(_join(path, i), x) for i, x in enumerate(v)]
        stack.extend(reversed(items))
    return None


def refusal(value: Any) -> str | None:
    """The message refusing ``value`` (naming where inside it the NUL is), or None."""
    where = find_nul(value)
    if where is None:
        return None
    return f"{where}: {NUL_REFUSED}" if where else NUL_REFUSED


def no_nul(value: Any) -> Any:
    """A validator (``AfterValidator(no_nul)``): ``value`` unchanged, or ValueError."""
    msg = refusal(value)
    if msg is not None:
        raise ValueError(msg)
    return value


class NoNul(BaseModel):
    """An input model whose every field refuses a NUL anywhere in its value (a 422 naming
    the field; the message names the place inside a nested value). Checked before the
    field's own validators, so the NUL is what the answer names; a field that is itself a
    ``NoNul`` model checks its own fields (the answer then names the inner field)."""

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_nul(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        inner = field.annotation if field is not None else None
        if isinstance(inner, type) and issubclass(inner, NoNul):
            return value
        return no_nul(value)
