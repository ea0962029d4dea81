"""What a run's server controls and the engine's identity say, as rows of (label, text) for
the run page and the CLI (``control_rows``). Pure: reads the run's load statistics
(``server_controls``, ``server_identity``, written by ``app.client.server_controls`` and
``app.client.server_identity``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_INFO_ROWS = 12  # of the engine's /server_info, shown (the JSON keeps all it kept)


def _pct(v: Any) -> str:
    return f"{float(v) * 100:.1f}%" if isinstance(v, int | float) else "n/a"


def _num(v: Any, digits: int = 2) -> str:
    return f"{float(v):.{digits}f}" if isinstance(v, int | float) else "n/a"


def spec_decode_text(sd: Mapping[str, Any]) -> str:
    """e.g. "acceptance rate 32.2% (67 of 208 draft tokens); mean acceptance length 2.29
    tokens per step over 52 drafts (draft length 4); by position 67.3%, 36.5%"."""
    acc, drafted, drafts = sd.get("accepted_tokens"), sd.get("draft_tokens"), sd.get("drafts")
    text = f"acceptance rate {_pct(sd.get('acceptance_rate'))}"
    if isinstance(acc, int | float) and isinstance(drafted, int | float):
        text += f" ({acc:,.0f} of {drafted:,.0f} draft tokens)"
    if sd.get("mean_acceptance_length") is not None:
        length = _num(sd.get("draft_length"), 1)
        text += (
            f"; mean acceptance length {_num(sd['mean_acceptance_length'])} tokens per step "
            f"over {float(drafts or 0):,.0f} drafts (draft length {length})"
        )
    per_pos = sd.get("per_position_acceptance") or []
    if per_pos:
        text += "; by position " + ", ".join(_pct(p) for p in per_pos)
    return text + " (measured window)"


def control_rows(load: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows for the run's server controls and identity; [] when the run has neither."""
    rows: list[tuple[str, str]] = []
    ident = load.get("server_identity")
    if isinstance(ident, Mapping):
        if ident.get("version"):
            rows.append(("engine version", str(ident["version"])))
        if ident.get("max_model_len") is not None:
            rows.append(("max model length", f"{ident['max_model_len']:,} tokens"))
        info = ident.get("server_info")
        if isinstance(info, Mapping) and info:
            shown = list(info.items())[:MAX_INFO_ROWS]
            text = ", ".join(f"{k}={v}" for k, v in shown)
            more = len(info) - len(shown)
            rows.append(
                (f"server info ({ident.get('server_info_path', '')})",
                 text + (f" (+{more} more in the JSON)" if more > 0 else ""))
            )  # fmt: skip
        missing = ident.get("unavailable")
        if isinstance(missing, Mapping) and missing:
            rows.append(
                ("identity not read", "; ".join(f"GET {k}: {v}" for k, v in missing.items()))
            )
    ctl = load.get("server_controls")
    if isinstance(ctl, Mapping):
        reset = ctl.get("prefix_cache_reset")
        if isinstance(reset, Mapping):
            if reset.get("reset"):
                text = f"reset before the measured requests ({reset.get('via')})"
            else:
                text = "NOT reset: " + "; ".join(str(t) for t in reset.get("tried") or [])
            rows.append(("prefix cache", text))
        prof = ctl.get("profile")
        if isinstance(prof, Mapping):
            if prof.get("started"):
                text = "profiled over the measured window"
                text += "" if prof.get("stopped") else " (stop failed: may still run)"
                text += f"; trace: {prof['trace_path']}" if prof.get("trace_path") else ""
            else:
                text = f"not profiled: {prof.get('error')}"
            rows.append(("server profiler", text))
        sd = ctl.get("spec_decode")
        if isinstance(sd, Mapping):
            rows.append(("speculative decoding", spec_decode_text(sd)))
    return rows
