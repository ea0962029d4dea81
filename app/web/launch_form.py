"""The launch form: its fields, their defaults, and form values -> ``RunCreate`` (or errors
keyed by field, for messages beside the fields)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.analysis.metric_defs import slo_metrics
from app.api.schemas import RunCreate
from app.client.datasets import DATASETS
from app.client.endpoints import ENDPOINTS
from app.client.limits import ClientLimits
from app.client.routing import ROUTINGS, ModelShare, mix_label
from app.client.spec import RunSpec
from app.settings import Settings
from app.web import dataset_fields, endpoint_fields
from app.web.dataset_fields import DatasetGroup
from app.web.endpoint_fields import EndpointGroup

# the dataset types' own options, one group each, shown after the dataset path
DATASET_GROUPS: tuple[DatasetGroup, ...] = dataset_fields.GROUPS
# the endpoints' own options, one group each, shown after the endpoint
ENDPOINT_GROUPS: tuple[EndpointGroup, ...] = endpoint_fields.GROUPS


@dataclass(frozen=True, slots=True)
class FormField:
    name: str
    label: str
    kind: str = "text"  # text | number | select | checkbox | textarea | password
    help: str = ""
    choices: tuple[str, ...] = ()
    required: bool = False
    group: str = "Target"


def _help(name: str) -> str:
    info = RunSpec.model_fields.get(name)
    return (info.description or "") if info is not None else ""


FIELDS: tuple[FormField, ...] = (
    FormField("name", "Run name", help="shown in the runs table", group="Target"),
    FormField(
        "base_url",
        "Base URL",
        required=True,
        help=_help("base_url") + "; several targets: comma-separated (see Routing)",
    ),
    FormField(
        "model",
        "Model",
        required=True,
        help="the model name the server expects; a weighted mix (LoRA adapters are model "
        "names): name:weight, comma-separated, e.g. llama-8b:0.7,llama-8b-lora-sql:0.3",
    ),
    FormField(
        "routing",
        "Routing",
        "select",
        choices=ROUTINGS,
        help="several base URLs: " + _help("routing"),
    ),
    FormField("session_header", "Session header", help=_help("session_header")),
    FormField(
        "endpoint",
        "Endpoint",
        "select",
        choices=tuple(ENDPOINTS),
        help="; ".join(f"{k}: {e.summary}" for k, e in ENDPOINTS.items()),
    ),
    FormField(
        "api_key",
        "API key",
        "password",
        help="sent to the target; kept encrypted until a worker leases the run, then deleted "
        "from the queue; or name a worker's variable below",
    ),
    FormField(
        "api_key_env",
        "API key variable",
        help="TOKENTRACE_TARGET_KEY_<NAME> on the worker: the key never reaches this server, "
        "and goes only to the targets its ..._TARGETS variable there lists",
    ),
    FormField("dataset", "Dataset", "select", choices=tuple(DATASETS), group="Workload"),
    FormField("dataset_path", "Dataset path", help="JSONL file on the worker", group="Workload"),
    FormField("input_len", "Input length (tokens)", "number", group="Workload"),
    FormField("output_len", "Output length (tokens)", "number", group="Workload"),
    FormField(
        "num_prompts",
        "Number of requests",
        "number",
        help="blank: 100, or a trace's every line (mooncake, timed_jsonl); agentic, otel: "
        "sessions (blank: all)",
        group="Workload",
    ),
    FormField("seed", "Seed", "number", group="Workload"),
    FormField("tokenizer", "Tokenizer path", help=_help("tokenizer"), group="Workload"),
    FormField("ignore_eos", "Ignore EOS", "checkbox", group="Workload"),
    FormField(
        "multi_turn",
        "Multi-turn sessions",
        "checkbox",
        help="replay each conversation (sharegpt, jsonl) as a session of turns on the chat "
        "endpoint; requests and concurrency then count sessions",
        group="Workload",
    ),
    FormField("max_turns", "Max turns", "number", help="blank: every turn", group="Workload"),
    FormField(
        "turn_delay_ms", "Think time (ms)", "number", help=_help("turn_delay_ms"), group="Workload"
    ),
    FormField(
        "token_counting",
        "Token counting",
        "select",
        choices=("auto", "usage", "tokenizer"),
        group="Workload",
    ),
    FormField("request_rate", "Request rate (req/s)", help="inf sends all at once", group="Load"),
    FormField(
        "arrival", "Arrival", "select", choices=("poisson", "gamma", "constant"), group="Load"
    ),
    FormField("burstiness", "Burstiness", "number", help=_help("burstiness"), group="Load"),
    FormField("max_concurrency", "Max concurrency", "number", help="blank: no cap", group="Load"),
    FormField("processes", "Load processes", help=_help("processes"), group="Load"),
    FormField("shards", "Shards (workers)", "number", help=_help("shards"), group="Load"),
    FormField("warmup_requests", "Warm-up requests", "number", group="Load"),
    FormField("request_timeout_s", "Request timeout (s)", "number", group="Load"),
    FormField(
        "connection_mode",
        "Connections",
        "select",
        choices=("keep-alive", "new"),
        help="keep-alive: one per slot, reused (as production clients); new: one per request",
        group="Load",
    ),
    FormField("max_duration_s", "Max duration (s)", "number", help="blank: none", group="Load"),
    FormField(
        "ramp_up_strategy",
        "Ramp-up",
        "select",
        choices=("", "linear", "exponential"),
        help="the rate ramps from start to end over the requests (vLLM's); leave the "
        "request rate at inf",
        group="Load",
    ),
    FormField("ramp_up_start_rps", "Ramp-up start (req/s)", "number", group="Load"),
    FormField("ramp_up_end_rps", "Ramp-up end (req/s)", "number", group="Load"),
    *(  # one per SLO of the metric registry (``Metric.slo``)
        FormField(
            f"goodput_{name}",
            f"{m.name} SLO ({m.unit})",
            "number",
            help=f"needs {m.requires}; blank: none" if m.requires else "blank: none",
            group="Goodput",
        )
        for name, m in slo_metrics().items()
    ),
    FormField(
        "client_lag_bound_ms",
        "Client lag bound (ms)",
        "number",
        help=_help("client_lag_bound_ms"),
        group="Goodput",
    ),
    FormField(
        "max_error_rate",
        "Max error rate (0-1)",
        "number",
        help=_help("max_error_rate"),
        group="Goodput",
    ),
    FormField("engine", "Engine", help="e.g. vllm (for reproduction)", group="Reproduction"),
    FormField("engine_version", "Engine version", group="Reproduction"),
    FormField("dtype", "dtype", group="Reproduction"),
    FormField("engine_flags", "Engine flags", group="Reproduction"),
    FormField(
        "extra_body",
        "Extra body (JSON)",
        "textarea",
        help="merged into each request",
        group="Reproduction",
    ),
    FormField("temperature", "Temperature", "number", help="blank: the server's", group="Sampling"),
    FormField("top_p", "top_p", "number", group="Sampling"),
    FormField("top_k", "top_k", "number", help=_help("top_k"), group="Sampling"),
    FormField("min_p", "min_p", "number", group="Sampling"),
    FormField("repetition_penalty", "Repetition penalty", "number", group="Sampling"),
    FormField("frequency_penalty", "Frequency penalty", "number", group="Sampling"),
    FormField("presence_penalty", "Presence penalty", "number", group="Sampling"),
    FormField("stream", "Stream", "checkbox", help=_help("stream"), group="Sampling"),
    FormField(
        "headers",
        "Extra headers",
        "textarea",
        help="one 'Name: value' per line, sent on every request; secret-looking names are "
        "refused (use the API key fields)",
        group="Sampling",
    ),
    FormField(
        "scrape_metrics",
        "Scrape server metrics",
        "checkbox",
        help="the target's Prometheus /metrics, about once a second",
        group="Server metrics",
    ),
    FormField("metrics_url", "Metrics URL", help=_help("metrics_url"), group="Server metrics"),
    FormField(
        "metrics_series",
        "Extra series",
        help="metric names beyond the built-in ones, comma-separated",
        group="Server metrics",
    ),
    FormField(
        "reset_prefix_cache",
        "Reset prefix cache",
        "checkbox",
        help=_help("reset_prefix_cache") + "; a sweep: before each step",
        group="Server controls",
    ),
    FormField(
        "server_profile",
        "Profile the server",
        "checkbox",
        help=_help("server_profile"),
        group="Server controls",
    ),
    FormField("tags", "Tags", help="comma-separated", group="Placement"),
    FormField("req_labels", "Worker labels", help="key=value, comma-separated", group="Placement"),
    FormField("req_gpu_name", "GPU name contains", group="Placement"),
    FormField("req_min_gpu_memory_mb", "Min GPU memory (MB)", "number", group="Placement"),
    *(
        FormField(
            f"limits_{key}",
            key.removeprefix("max_").replace("_", " ").capitalize() + " at most",
            "number",
            help=f"{info.description}; default {info.default:,}",
            group="Limits",
        )
        for key, info in ClientLimits.model_fields.items()
    ),
)
LIMIT_KEYS = tuple(ClientLimits.model_fields)  # the form's limits_<key> fields
FIELD_NAMES = frozenset(f.name for f in FIELDS)
GROUPS: tuple[str, ...] = (
    "Target", "Workload", "Load", "Goodput", "Sampling", "Server metrics", "Server controls",
    "Reproduction", "Placement", "Limits",
)  # fmt: skip
LIST_FIELDS = ("tags", "metrics_series")  # comma-separated in the form, lists in the spec
CHECKBOXES_ON = ("ignore_eos", "scrape_metrics", "stream")  # default on
JSON_FIELDS = {"extra_body": '{"temperature": 0}'}
SLO_KEYS = tuple(slo_metrics())


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "on" if v else ""
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    if isinstance(v, dict):
        return json.dumps(v) if v else ""
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    return str(v)


def defaults(settings: Settings | None = None) -> dict[str, str]:
    """Form values of a fresh launch: RunSpec's defaults, the server's default target
    (``default_target_url`` / ``default_target_model``; ``serve --demo``: its simulator)."""
    if settings is None:
        url = str(Settings.model_fields["default_target_url"].default)
        model = str(Settings.model_fields["default_target_model"].default)
    else:
        url, model = settings.default_target_url, settings.default_target_model
    out: dict[str, str] = {"base_url": url, "model": model}
    for name, info in RunSpec.model_fields.items():
        if name in JSON_FIELDS or name in (
            "base_url", "model", "goodput", "tags", "api_key", "dataset_options",
            "endpoint_options", "limits", "model_mix", "base_urls",
        ):  # fmt: skip
            continue
        default = info.get_default(call_default_factory=True)
        out[name] = _text(default)
    for name in CHECKBOXES_ON:
        out[name] = "on" if RunSpec.model_fields[name].default else ""
    for key in LIMIT_KEYS:
        out[f"limits_{key}"] = _text(ClientLimits.model_fields[key].default)
    for groups in (DATASET_GROUPS, ENDPOINT_GROUPS):
        for group in groups:
            for f in group.fields:
                out[f.name] = _text(f.default)
    return out


def values_from_spec(
    spec: dict[str, Any], name: str | None, settings: Settings | None = None
) -> dict[str, str]:
    """Form values that repeat a stored run's spec ("launch again")."""
    out = defaults(settings)
    for key, v in spec.items():
        if key in FIELD_NAMES:
            out[key] = _text(v)
    urls, mix = spec.get("base_urls"), spec.get("model_mix")
    if isinstance(urls, list) and urls:  # several targets: the form's comma-separated list
        out["base_url"] = ", ".join(str(u) for u in urls)
    if isinstance(mix, list) and mix:  # a mix: name:weight, comma-separated
        out["model"] = mix_label([ModelShare.model_validate(m) for m in mix])
    for k, ms in (spec.get("goodput") or {}).items():
        out[f"goodput_{k}"] = _text(float(ms))
    limits = spec.get("limits")
    if isinstance(limits, dict):
        for key in LIMIT_KEYS:
            if key in limits:
                out[f"limits_{key}"] = _text(limits[key])
    for key in LIST_FIELDS:
        out[key] = _text(spec.get(key) or [])
    headers = spec.get("headers") or {}
    out["headers"] = (
        "\n".join(f"{k}: {v}" for k, v in headers.items()) if isinstance(headers, dict) else ""
    )
    out["name"] = f"{name} (again)" if name else ""
    for key in CHECKBOXES_ON:
        out[key] = "on" if spec.get(key, True) else ""
    options = spec.get("dataset_options")
    group = dataset_fields.BY_DATASET.get(str(spec.get("dataset")))
    if group is not None and isinstance(options, dict):  # stored less the defaults
        for f in group.fields:
            if f.option in options:
                out[f.name] = _text(options[f.option])
    surface_options = spec.get("endpoint_options")
    surface = endpoint_fields.BY_ENDPOINT.get(str(spec.get("endpoint")))
    if surface is not None and isinstance(surface_options, dict):
        for f in surface.fields:
            if f.option in surface_options:
                out[f.name] = _text(surface_options[f.option])
    return out


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _headers(text: str) -> dict[str, str]:
    """'Name: value' lines as headers (blank lines skipped)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"line {n} is not 'Name: value'")
        out[key.strip()] = value.strip()
    return out


def _loc_field(loc: tuple[Any, ...], msg: str) -> str:
    if not loc:  # a model validator's message names its field first ("metrics_url must ...")
        first = msg.split(" ", 1)[0].rstrip(":")
        if first.startswith(("dataset_options.", "endpoint_options.")):  # an option: its input
            return first
        first = first.split(".", 1)[0]
        if first in FIELD_NAMES:
            return first
        return "dataset_path" if "dataset_path" in msg else "__all__"
    head = str(loc[0])
    if head == "goodput" and len(loc) > 1 and str(loc[1]) in SLO_KEYS:
        return f"goodput_{loc[1]}"
    if head == "goodput":
        return "goodput_ttft"
    if head == "limits" and len(loc) > 1 and str(loc[1]) in LIMIT_KEYS:
        return f"limits_{loc[1]}"
    if head in ("model_mix", "base_urls"):  # written in the model / base URL field
        return "model" if head == "model_mix" else "base_url"
    if head == "requirements":
        sub = str(loc[1]) if len(loc) > 1 else "labels"
        return {"labels": "req_labels", "gpu_name": "req_gpu_name"}.get(
            sub, "req_min_gpu_memory_mb"
        )
    return head if head in FIELD_NAMES else "__all__"


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def form_body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The launch fields of a form as a ``RunCreate`` body (not yet validated), and the
    messages of fields that could not even be read (JSON, labels)."""
    errors: dict[str, str] = {}
    body: dict[str, Any] = {}
    for f in FIELDS:
        raw = (form.get(f.name) or "").strip()
        if f.kind == "checkbox":
            body[f.name] = raw not in ("", "0", "false", "off")
            continue
        if f.name.startswith(("goodput_", "req_", "limits_")) or f.name in (
            *LIST_FIELDS,
            *JSON_FIELDS,
            "headers",
        ):
            continue
        if raw:
            body[f.name] = raw
    slos: dict[str, str] = {}
    for key in SLO_KEYS:
        raw = (form.get(f"goodput_{key}") or "").strip()
        if raw:
            slos[key] = raw
    body["goodput"] = slos
    limits = {k: raw for k in LIMIT_KEYS if (raw := (form.get(f"limits_{k}") or "").strip())}
    if limits:
        body["limits"] = limits
    body["dataset_options"] = dataset_fields.options_of(form)
    body["endpoint_options"] = endpoint_fields.options_of(form)
    for key in LIST_FIELDS:
        body[key] = _list(form.get(key) or "")
    for key, example in JSON_FIELDS.items():
        raw = (form.get(key) or "").strip()
        if not raw:
            continue
        try:
            parsed = json.loads(raw)
            if not isinstance(parsed, dict):
                raise ValueError("not an object")
            body[key] = parsed
        except ValueError:
            errors[key] = f"must be a JSON object, e.g. {example}"
    try:
        body["headers"] = _headers(form.get("headers") or "")
    except ValueError as e:
        errors["headers"] = str(e)
    req: dict[str, Any] = {}
    try:
        req["labels"] = _labels(form.get("req_labels") or "")
    except ValueError as e:
        errors["req_labels"] = str(e)
    if (form.get("req_gpu_name") or "").strip():
        req["gpu_name"] = form["req_gpu_name"].strip()
    if (form.get("req_min_gpu_memory_mb") or "").strip():
        req["min_gpu_memory_mb"] = form["req_min_gpu_memory_mb"].strip()
    body["requirements"] = req
    return body, errors


def validation_errors(e: ValidationError, field_of: Any = None) -> dict[str, str]:
    """A pydantic error -> form field name -> message (``field_of`` maps extra fields)."""
    errors: dict[str, str] = {}
    for err in e.errors():
        loc = tuple(err.get("loc") or ())
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        field = field_of(loc, msg) if field_of is not None else None
        errors.setdefault(field or _loc_field(loc, msg), msg)
    return errors


def place_option_errors(errors: dict[str, str], form: dict[str, str]) -> dict[str, str]:
    """Errors keyed ``dataset_options.<option>`` (``endpoint_options.<option>``) moved beside
    that option's input of the chosen dataset type (endpoint), else beside its select."""
    dataset = (form.get("dataset") or "").strip()
    endpoint = (form.get("endpoint") or "").strip()
    out: dict[str, str] = {}
    for key, msg in errors.items():
        if key.startswith("dataset_options"):
            key = dataset_fields.field_of_error(dataset, key) or "dataset"
        elif key.startswith("endpoint_options"):
            key = endpoint_fields.field_of_error(endpoint, key) or "endpoint"
        out.setdefault(key, msg)
    return out


def parse(form: dict[str, str]) -> tuple[RunCreate | None, dict[str, str]]:
    """Form values -> a validated ``RunCreate``; else field name -> message."""
    body, errors = form_body(form)
    try:
        created = RunCreate.model_validate(body)
    except ValidationError as e:
        return None, place_option_errors(validation_errors(e) | errors, form)
    if errors:
        return None, errors
    return created, {}
