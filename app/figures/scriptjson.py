"""JSON for ``<script type="application/json">`` blocks, and Plotly text made inert.

``script_json`` writes strict JSON (no NaN) in which ``<``, ``>``, ``&``, U+2028 and U+2029
appear only as ``\\uXXXX`` escapes, so nothing in the data can close the script element,
open a comment, or be read as markup by the HTML parser; ``JSON.parse`` gives the same
data back. (Escaping only ``</``, as the pages did, left ``<!--`` and the rest.)

Plotly renders trace names, titles, annotation and hover text as a subset of HTML (links
included). ``plotly_json`` HTML-escapes the text fields of a figure, keeping only the bare
formatting tags figures use on purpose (``<br>``, ``<b>``, ``<i>``, ``<sup>``, ``<sub>``,
``<extra>``), so a run, sweep or series name is shown as written and never as markup.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from typing import Any

_SCRIPT_UNSAFE = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}

# keys whose strings Plotly renders as (pseudo-)HTML
TEXT_KEYS = frozenset(
    {"name", "text", "title", "hovertext", "hovertemplate", "texttemplate", "ticktext"}
)
_KEPT_TAG = re.compile(r"</?(?:br|b|i|sup|sub|extra)\s*/?>", re.IGNORECASE)


def script_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as JSON safe to place between ``<script ...>`` and ``</script>``."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=default)
    return text.translate(_SCRIPT_UNSAFE)


def plot_text(text: str) -> str:
    """``text`` HTML-escaped for Plotly, except the bare formatting tags it keeps."""
    out: list[str] = []
    pos = 0
    for m in _KEPT_TAG.finditer(text):
        out.append(html.escape(text[pos : m.start()], quote=False))
        out.append(m.group(0))
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def _inert(value: Any, text: bool) -> Any:
    if isinstance(value, str):
        return plot_text(value) if text else value
    if isinstance(value, dict):
        return {k: _inert(v, text or k in TEXT_KEYS) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_inert(v, text) for v in value]
    return value


def inert_figure(fig: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Plotly figure with its text fields escaped (``plot_text``)."""
    out: dict[str, Any] = _inert(fig, False)
    return out


def plotly_json(fig: dict[str, Any], *, default: Callable[[Any], Any] | None = None) -> str:
    """A Plotly figure for a ``<script type="application/json">`` block."""
    return script_json(inert_figure(fig), default=default)
