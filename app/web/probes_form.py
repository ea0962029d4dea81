"""The probe form: kind, device, the chosen kind's parameters and worker requirements;
form values -> a ``ProbeCreate`` (what ``POST /api/v1/probes`` accepts) or errors keyed by
field. Each kind's parameter fields are named ``<kind>_<param>``; blank ones take the
kind's defaults, and "Extra parameters (JSON)" reaches the rest (e.g. ``llm_shapes``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app.api.routes_probes import ProbeCreate
from app.probes.spec import PARAMS, PROBE_KINDS, RANDOM_TINY_LLAMA
from app.web import launch_form
from app.web.launch_form import FormField

GROUP_OF = {
    "ceilings": "Ceilings parameters",
    "linear": "Linear parameters",
    "batch_scaling": "Batch scaling parameters",
}
_LIST_HELP = "comma-separated; blank: the device's defaults"
LIST_PARAMS = {"copy_mib", "square", "dtypes", "batches"}  # comma-separated in the form
PARAM_FIELDS: dict[str, tuple[FormField, ...]] = {
    "ceilings": (
        FormField("ceilings_copy_mib", "Copy sizes (MiB)", help=_LIST_HELP),
        FormField("ceilings_square", "Square matmul sizes", help=_LIST_HELP),
        FormField("ceilings_dtypes", "Matmul dtypes", help="fp32, tf32, bf16, fp16, fp8"),
        FormField("ceilings_warmup", "Warm-up iterations", "number"),
        FormField("ceilings_iters", "Iterations", "number"),
    ),
    "linear": (
        FormField("linear_width", "Width", "number", help="cuda 4096, cpu 256"),
        FormField("linear_batch", "Batch", "number", help="cuda 8, cpu 4"),
        FormField("linear_seq", "Sequence length", "number", help="cuda 512, cpu 64"),
        FormField("linear_dtype", "dtype", "select", choices=("bf16", "fp16", "fp32")),
        FormField("linear_sweep_max", "Sweep up to M", "number", help="cuda 4096, cpu 256"),
        FormField("linear_warmup", "Warm-up iterations", "number"),
        FormField("linear_iters", "Iterations", "number"),
        FormField("linear_trace", "Keep a profiler trace", "checkbox"),
    ),
    "batch_scaling": (
        FormField(
            "batch_scaling_model_path",
            "Model path",
            help=f"a Hugging Face folder or .gguf file on the worker, or {RANDOM_TINY_LLAMA}",
        ),
        FormField("batch_scaling_input_len", "Input length", "number"),
        FormField("batch_scaling_output_len", "Output length", "number"),
        FormField("batch_scaling_batches", "Batch sizes", help="increasing, comma-separated"),
        FormField("batch_scaling_dtype", "dtype", "select", choices=("bf16", "fp16", "fp32")),
        FormField("batch_scaling_seed", "Seed", "number"),
    ),
}
FIELDS: tuple[FormField, ...] = (
    FormField("kind", "Kind", "select", choices=PROBE_KINDS, group="Probe",
              help="ceilings: copy bandwidth and matmul FLOP/s; linear: prefill vs decode of "
              "one layer; batch_scaling: a model's throughput vs batch size"),
    FormField("device", "Device", "select", choices=("cuda", "cpu"), group="Probe",
              help="cpu probes the worker's CPU on purpose"),
    FormField("device_index", "Device index", "number", group="Probe"),
    FormField("name", "Name", group="Probe", help="shown in the probes list"),
    *[
        FormField(f.name, f.label, f.kind, f.help, f.choices, f.required, GROUP_OF[kind])
        for kind, fields in PARAM_FIELDS.items()
        for f in fields
    ],
    FormField("params_json", "Extra parameters (JSON)", "textarea", group="Probe",
              help="merged into the chosen kind's parameters, e.g. "
              '{"llm_shapes": [[1, 4096, 4096]]}'),
    FormField("req_labels", "Worker labels", help="key=value, comma-separated", group="Placement"),
    FormField("req_gpu_name", "GPU name contains", group="Placement"),
    FormField("req_min_gpu_memory_mb", "Min GPU memory (MB)", "number", group="Placement"),
)  # fmt: skip
GROUPS: tuple[str, ...] = ("Probe", *GROUP_OF.values(), "Placement")


def defaults() -> dict[str, str]:
    out = {"kind": "ceilings", "device": "cuda", "device_index": "0"}
    for kind, model in PARAMS.items():
        for f in PARAM_FIELDS[kind]:
            key = f.name.removeprefix(f"{kind}_")
            info = model.model_fields[key]
            v = None if info.is_required() else info.get_default(call_default_factory=True)
            if isinstance(v, bool):
                out[f.name] = "on" if v else ""
            elif isinstance(v, list):
                out[f.name] = ", ".join(str(x) for x in v)
            else:
                out[f.name] = "" if v is None else str(v)
    return out


def _params(kind: str, form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    errors: dict[str, str] = {}
    params: dict[str, Any] = {}
    for f in PARAM_FIELDS[kind]:
        key = f.name.removeprefix(f"{kind}_")
        raw = (form.get(f.name) or "").strip()
        if f.kind == "checkbox":
            params[key] = raw not in ("", "0", "false", "off")
        elif key in LIST_PARAMS:
            if raw:
                params[key] = [x.strip() for x in raw.replace(" ", ",").split(",") if x.strip()]
        elif raw:
            params[key] = raw
    extra = (form.get("params_json") or "").strip()
    if extra:
        try:
            parsed = json.loads(extra)
            if not isinstance(parsed, dict):
                raise ValueError("not an object")
            params |= parsed
        except ValueError:
            errors["params_json"] = 'must be a JSON object, e.g. {"iters": 5}'
    return params, errors


def parse(form: dict[str, str]) -> tuple[ProbeCreate | None, dict[str, str]]:
    """Form values -> a validated ``ProbeCreate``; else field name -> message."""
    kind = (form.get("kind") or "").strip()
    if kind not in PARAMS:
        return None, {"kind": f"choose one of {', '.join(PROBE_KINDS)}"}
    params, errors = _params(kind, form)
    own = {f.name.removeprefix(f"{kind}_") for f in PARAM_FIELDS[kind]}
    try:
        params = PARAMS[kind].model_validate(params).model_dump(mode="json")
    except ValidationError as e:
        for err in e.errors():
            loc = tuple(err.get("loc") or ())
            key = str(loc[0]) if loc else ""
            field = f"{kind}_{key}" if key in own else "params_json"
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            errors.setdefault(field, f"{key}: {msg}" if field == "params_json" else msg)
    body: dict[str, Any] = {"kind": kind, "params": params}
    for key in ("device", "device_index", "name"):
        raw = (form.get(key) or "").strip()
        if raw:
            body[key] = raw
    req: dict[str, Any] = {}
    try:
        req["labels"] = launch_form._labels(form.get("req_labels") or "")
    except ValueError as e:
        errors["req_labels"] = str(e)
    for key in ("gpu_name", "min_gpu_memory_mb"):
        raw = (form.get(f"req_{key}") or "").strip()
        if raw:
            req[key] = raw
    body["requirements"] = req
    if errors:
        return None, errors
    try:
        created = ProbeCreate.model_validate(body)
    except ValidationError as e:
        out: dict[str, str] = {}
        for err in e.errors():
            loc = tuple(err.get("loc") or ())
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            head = str(loc[0]) if loc else "__all__"
            if head == "requirements":
                sub = str(loc[1]) if len(loc) > 1 else "labels"
                head = f"req_{sub}"
            out.setdefault(head if head in FIELD_NAMES else "__all__", msg)
        return None, out
    return created, {}


FIELD_NAMES = frozenset(f.name for f in FIELDS)
