"""The sweep form: the launch form's workload fields (the base of every step), the loads
(rates, concurrencies or auto) and the stop rules; form values -> ``SweepCreate`` and its
plan (or errors keyed by field, for messages beside the fields)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from app.analysis.metric_defs import slo_metrics
from app.analysis.slo_search import DEFAULT_CONFIDENCE, DEFAULT_MAX_STEPS, FIND_KINDS
from app.api.routes_sweeps import SweepCreate
from app.client.sweep_plan import MAX_STEPS, SweepPlan
from app.services.errors import ServiceError
from app.settings import Settings
from app.web import launch_form
from app.web.launch_form import FormField

MODES = ("rates", "concurrencies", "auto", "find-max")
# the find-max fields and the API's find_max field each fills
FIND_MAX_FIELDS = {
    "find_max_kind": "kind",
    "slos": "slos",
    "confidence": "confidence",
    "max_steps": "max_steps",
}
_FORM_OF_FIND_MAX = {v: k for k, v in FIND_MAX_FIELDS.items()}
# each step sets its own request rate (or concurrency), so the run form's rate is left out
_BASE = tuple(f for f in launch_form.FIELDS if f.name != "request_rate")
SWEEP_FIELDS: tuple[FormField, ...] = (
    FormField(
        "sweep_mode",
        "Steps",
        "select",
        choices=MODES,
        help="rates: one step per request rate; concurrencies: one per number of requests "
        "in flight (all sent at once); auto: a synchronous and a max-throughput run, then "
        "rates between them; find-max: the largest load meeting the SLOs below (bisection)",
        group="Sweep",
    ),
    FormField(
        "loads",
        "Loads",
        help=f"rates (req/s) or concurrencies, increasing, comma-separated (1 to {MAX_STEPS}); "
        "blank for auto",
        group="Sweep",
    ),
    FormField(
        "auto_steps", "Auto steps", "number", help="auto: rates between the two runs", group="Sweep"
    ),
    FormField(
        "find_max_kind",
        "Find max of",
        "select",
        choices=FIND_KINDS,
        help="find-max: search the largest concurrency or request rate",
        group="Sweep",
    ),
    FormField(
        "slos",
        "SLOs",
        help="find-max: METRIC:PCT:LIMIT (ms), comma-separated, e.g. ttft:p99:500, tpot:p99:50 "
        f"(metrics: {', '.join(slo_metrics())})",
        group="Sweep",
    ),
    FormField(
        "confidence",
        "Confidence",
        "number",
        help="find-max: each SLO must hold with this confidence, in (0, 1)",
        group="Sweep",
    ),
    FormField(
        "max_steps", "Max steps", "number", help="find-max: probed steps, at most", group="Sweep"
    ),
    FormField(
        "min_ratio",
        "Saturation ratio",
        "number",
        help="a step achieving less than this x its offered load is saturated: the sweep stops",
        group="Sweep",
    ),
)
FIELDS: tuple[FormField, ...] = (_BASE[0], *SWEEP_FIELDS, *_BASE[1:])
GROUPS: tuple[str, ...] = ("Target", "Sweep", *launch_form.GROUPS[1:])
_SPLIT = re.compile(r"[,\s]+")
_FIELD_NAMES = frozenset(f.name for f in FIELDS)


def defaults(settings: Settings | None = None) -> dict[str, str]:
    out = launch_form.defaults(settings)
    out.pop("request_rate", None)
    sweep = SweepCreate.model_fields
    out |= {
        "sweep_mode": "rates",
        "loads": "",
        "auto_steps": str(sweep["auto_steps"].default),
        "min_ratio": f"{sweep['min_ratio'].default:g}",
        "find_max_kind": "concurrency",
        "slos": "",
        "confidence": f"{DEFAULT_CONFIDENCE:g}",
        "max_steps": str(DEFAULT_MAX_STEPS),
    }
    return out


def values_from_sweep(
    spec: dict[str, Any],
    mode: str,
    loads: list[float],
    plan: dict[str, Any] | None,
    name: str | None,
    settings: Settings | None = None,
    requirements: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Form values that repeat a stored sweep ("launch again"): its base spec, its mode and
    loads (an auto sweep's chosen rates are not repeated: it chooses again), its stop rules
    and worker requirements where its job kept them."""
    out = launch_form.values_from_spec(spec, name, settings)
    out.pop("request_rate", None)
    defaults_ = defaults(settings)
    out |= {k: defaults_[k] for k in ("auto_steps", "min_ratio", *FIND_MAX_FIELDS)}
    fm = plan.get("find_max") if plan else None
    if isinstance(fm, dict):
        out["find_max_kind"] = str(fm.get("kind") or "concurrency")
        out["slos"] = ", ".join(
            f"{s['metric']}:p{s['pct']:g}:{s['limit_ms']:g}" for s in fm.get("slos") or []
        )
        out["confidence"] = f"{fm.get('confidence', DEFAULT_CONFIDENCE):g}"
        out["max_steps"] = str(fm.get("max_steps", DEFAULT_MAX_STEPS))
    out["sweep_mode"] = mode if mode in MODES else "rates"
    out["loads"] = (
        "" if mode in ("auto", "find-max") else ", ".join(f"{x:g}" for x in loads if x > 0)
    )
    for key in ("auto_steps", "min_ratio"):
        if plan and plan.get(key) is not None:
            out[key] = f"{plan[key]:g}" if isinstance(plan[key], float) else str(plan[key])
    req = requirements or {}
    out["req_labels"] = ", ".join(f"{k}={v}" for k, v in (req.get("labels") or {}).items())
    for key in ("gpu_name", "min_gpu_memory_mb"):
        out[f"req_{key}"] = "" if req.get(key) is None else str(req[key])
    return out


def _field_of(loc: tuple[Any, ...], msg: str) -> str | None:
    head = str(loc[0]) if loc else ""
    if head == "find_max":
        return _FORM_OF_FIND_MAX.get(str(loc[1]) if len(loc) > 1 else "kind", "slos")
    if head in ("rates", "concurrencies"):
        return "loads"
    if head in ("auto_steps", "min_ratio"):
        return head
    if "exactly one of rates, concurrencies, auto or find_max" in msg:
        return "sweep_mode"
    return None


def parse(form: dict[str, str]) -> tuple[tuple[SweepCreate, SweepPlan] | None, dict[str, str]]:
    """Form values -> a validated ``SweepCreate`` and its plan; else field -> message."""
    body, errors = launch_form.form_body(form)
    body.pop("request_rate", None)
    mode = (form.get("sweep_mode") or "").strip()
    raw_loads = [x for x in _SPLIT.split((form.get("loads") or "").strip()) if x]
    if mode not in MODES:
        errors["sweep_mode"] = f"choose one of {', '.join(MODES)}"
    elif mode == "auto":
        body["auto"] = True
        if raw_loads:
            errors["loads"] = "an auto sweep chooses its own loads: leave this blank"
    elif mode == "find-max":
        if raw_loads:
            errors["loads"] = "a find-max sweep chooses its own loads: leave this blank"
        slos = [x for x in re.split(r"[,\s]+", (form.get("slos") or "").strip()) if x]
        if not slos:
            errors["slos"] = "give at least one SLO, e.g. tpot:p99:50"
        fm: dict[str, Any] = {"kind": (form.get("find_max_kind") or "").strip(), "slos": slos}
        for key in ("confidence", "max_steps"):
            raw = (form.get(key) or "").strip()
            if raw:
                fm[key] = raw
        body["find_max"] = fm
    elif not raw_loads:
        errors["loads"] = f"give 1 to {MAX_STEPS} {mode}, e.g. 2, 4, 8"
    else:
        body[mode] = raw_loads
    for key in ("auto_steps", "min_ratio"):
        raw = (form.get(key) or "").strip()
        if raw:
            body[key] = raw
    try:
        created = SweepCreate.model_validate(body)
    except ValidationError as e:
        found = launch_form.validation_errors(e, _field_of) | errors
        return None, launch_form.place_option_errors(found, form)
    if errors:
        return None, errors
    try:
        plan = created.plan()
    except ServiceError as e:
        field = str(e.loc[-1]) if e.loc else "loads"
        if e.loc and len(e.loc) > 2 and e.loc[1] == "find_max":
            field = _FORM_OF_FIND_MAX.get(field, "slos")
            return None, {field: e.detail.split(": ", 1)[-1]}
        if field in ("rates", "concurrencies") or field not in _FIELD_NAMES:
            field = "loads"
        if field in ("loads", "auto_steps"):  # their own message, less the API's field name
            return None, {field: e.detail.split(": ", 1)[-1]}
        return None, {field: e.detail}
    return (created, plan), {}
