"""Strict JSON for the database: identical on SQLite and PostgreSQL.

PostgreSQL's ``json`` type rejects ``NaN``/``Infinity``, so non-finite floats are written as
the strings ``"inf"`` / ``"-inf"`` (pydantic reads them back as floats) and NaN as ``null``
("no data"). numpy scalars and arrays become plain Python values; tuples become lists.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts."""
    if obj is None or isinstance(obj, bool | str | int):
        return obj.value if isinstance(obj, enum.Enum) else obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if math.isnan(obj):
            return None
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, enum.Enum):
        return json_safe(obj.value)
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                raise TypeError(f"JSON object keys must be strings, got {type(k).__name__}")
            out[str(k.value if isinstance(k, enum.Enum) else k)] = json_safe(v)
        return out
    if isinstance(obj, list | tuple | set | frozenset):
        return [json_safe(v) for v in obj]
    raise TypeError(f"cannot store a {type(obj).__name__} as JSON")


def dumps(obj: Any) -> str:
    """The engines' JSON serializer (see ``make_engine``)."""
    return json.dumps(json_safe(obj), allow_nan=False)
