"""What a run's server controls and the engine's identity say, as rows of (label, text) for
the run page and the CLI (``control_rows``). Pure: reads the run's load statistics
(``server_controls``, ``server_identity``, written by ``app.client.server_controls`` and
``app.client.server_identity``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def _identity_rows(ident: Mapping[str, Any], on: str = "") -> list[tuple[str, str]]:
    """One engine's identity rows (``on``: " (<its base URL>)" for one of several)."""
    rows: list[tuple[str, str]] = []
    if ident.get("version"):
        rows.append((f"engine version{on}", str(ident["version"])))
    if ident.get("max_model_len") is not None:
        rows.append((f"max model length{on}", f"{ident['max_model_len']:,} tokens"))
    info = ident.get("server_info")
    if isinstance(info, Mapping) and info:
        shown = list(info.items())[:MAX_INFO_ROWS]
        text = ", ".join(f"{k}={v}" for k, v in shown)
        more = len(info) - len(shown)
        rows.append(
            (f"server info ({ident.get('server_info_path', '')}){on}",
             text + (f" (+{more} more in the JSON)" if more > 0 else ""))
        )  # fmt: skip
    if on and "served_models" in ident:
        ids = ident.get("served_models")
        text = (
            ", ".join(str(m) for m in ids) or "no model"
            if isinstance(ids, list)
            else f"not listed ({ident.get('served_models_error')})"
        )
        rows.append((f"served models{on}", text))
    missing = ident.get("unavailable")
    if isinstance(missing, Mapping) and missing:
        rows.append(
            (f"identity not read{on}", "; ".join(f"GET {k}: {v}" for k, v in missing.items()))
        )
    return rows


def _reset_text(reset: Mapping[str, Any]) -> str:
    if reset.get("reset"):
        return f"reset before the measured requests ({reset.get('via')})"
    return "NOT reset: " + "; ".join(str(t) for t in reset.get("tried") or [])


def _profile_text(prof: Mapping[str, Any]) -> str:
    if not prof.get("started"):
        return f"not profiled: {prof.get('error')}"
    text = "profiled over the measured window"
    text += "" if prof.get("stopped") else " (stop failed: may still run)"
    return text + (f"; trace: {prof['trace_path']}" if prof.get("trace_path") else "")


def _per_target(
    label: str,
    block: Any,
    text: Callable[[Mapping[str, Any]], str],
    whole: Callable[[Mapping[str, Any]], str] | None = None,
) -> list[tuple[str, str]]:
    """A control's rows: one for a run of one target; for several, ``whole``'s row (when
    given) and one per target (``block["targets"]``, keyed by base URL)."""
    if not isinstance(block, Mapping):
        return []
    targets = block.get("targets")
    if not isinstance(targets, Mapping):
        return [(label, text(block))]
    rows = [(label, whole(block))] if whole is not None else []
    return rows + [
        (f"{label} ({url})", text(entry))
        for url, entry in targets.items()
        if isinstance(entry, Mapping)
    ]


def control_rows(load: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows for the run's server controls and identity; [] when the run has neither. A run
    of several targets has each target's rows, labelled with its base URL."""
    rows: list[tuple[str, str]] = []
    ident = load.get("server_identity")
    if isinstance(ident, Mapping):
        targets = ident.get("targets")
        if isinstance(targets, Mapping):
            for url, entry in targets.items():
                if isinstance(entry, Mapping):
                    rows += _identity_rows(entry, f" ({url})")
        else:
            rows += _identity_rows(ident)
    ctl = load.get("server_controls")
    if isinstance(ctl, Mapping):
        rows += _per_target("prefix cache", ctl.get("prefix_cache_reset"), _reset_text)
        rows += _per_target("server profiler", ctl.get("profile"), _profile_text)
        rows += _per_target(
            "speculative decoding",
            ctl.get("spec_decode"),
            spec_decode_text,
            lambda sd: "all targets: " + spec_decode_text(sd),
        )
    return rows
