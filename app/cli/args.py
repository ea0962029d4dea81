"""Argument parsing for the ``tokentrace`` command (flag names follow ``vllm bench serve``)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import types
import typing
from typing import Any, NoReturn

from pydantic import ValidationError

from app.analysis.metric_defs import slo_metrics
from app.client.datasets import DATASETS
from app.client.endpoints import ENDPOINTS, PATH_ALIASES
from app.client.spec import RunSpec


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


SERVER_PROFILE = "server"  # ``--profile`` alone: the server's profiler, not definitions


def definitions_profile(ns: argparse.Namespace) -> str | None:
    """The other tool whose definitions ``--profile NAME`` asks for (None for ``--profile``
    alone, which profiles the server)."""
    prof: str | None = ns.profile
    return None if prof == SERVER_PROFILE else prof


# RunSpec field -> the flag a user typed, for error messages.
FLAG_FOR_FIELD = {
    "base_url": "--base-url",
    "model": "--model",
    "endpoint": "--endpoint",
    "endpoint_options": "--endpoint",
    "dataset": "--dataset-name",
    "dataset_path": "--dataset-path",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "num_prompts": "--num-prompts",
    "seed": "--seed",
    "tokenizer": "--tokenizer",
    "request_rate": "--request-rate",
    "arrival": "--arrival",
    "burstiness": "--burstiness",
    "max_concurrency": "--max-concurrency",
    "processes": "--processes",
    "shards": "--shards",
    "warmup_requests": "--num-warmups",
    "request_timeout_s": "--request-timeout",
    "connection_mode": "--connection-mode",
    "max_duration_s": "--max-duration",
    "goodput": "--goodput",
    "client_lag_bound_ms": "--client-lag-bound-ms",
    "max_error_rate": "--max-error-rate",
    "metrics_url": "--metrics-url",
    "extra_body": "--extra-body",
    "token_counting": "--token-counting",
    "api_key": "--api-key",
    "api_key_env": "--api-key-env",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "frequency_penalty": "--frequency-penalty",
    "presence_penalty": "--presence-penalty",
    "headers": "--header",
    "stream": "--no-stream",
    "ramp_up_strategy": "--ramp-up-strategy",
    "ramp_up_start_rps": "--ramp-up-start-rps",
    "ramp_up_end_rps": "--ramp-up-end-rps",
    "multi_turn": "--multi-turn",
    "base_urls": "--base-url",
    "model_mix": "--model",
    "routing": "--routing",
    "session_header": "--session-header",
    "max_turns": "--max-turns",
    "turn_delay_ms": "--turn-delay-ms",
}

# other names of a dataset type's option flags (the trace flags)
OPTION_ALIASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("mooncake", "block_size"): ("--trace-block-size",),
    ("random-mm", "image_count"): ("--image-count",),
    ("random-mm", "image_size"): ("--image-size",),
}


def option_flag(dataset: str, field: str) -> str:
    """The flag of a dataset type's option: ``--<dataset-name>-<field>``, dashes for
    underscores (``--random-range-ratio``, ``--prefix-repetition-num-prefixes``)."""
    return f"--{dataset}-{field}".replace("_", "-")


def _option_dest(dataset: str, field: str) -> str:
    return f"dataset_option__{dataset}__{field}"


def _flag_type(annotation: Any) -> Any:
    """The argparse ``type`` of an option field: its one non-None type (int, float, str)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:  # its values: checked by the model
        return str
    if annotation not in (int, float, str):
        raise TypeError(f"dataset option of type {annotation!r} has no flag mapping")
    return annotation


# one flag for every trace type's ``speedup`` (mooncake, timed_jsonl, agentic, otel)
TRACE_SPEEDUP = "--trace-speedup"


def add_dataset_option_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per option of every registered dataset type (its ``options`` model), and
    ``--trace-speedup`` for the chosen type's ``speedup``."""
    takes = [k for k, d in DATASETS.items() if "speedup" in d.options.model_fields]
    p.add_argument(
        TRACE_SPEEDUP,
        type=float,
        default=argparse.SUPPRESS,
        dest="trace_speedup",
        metavar="FLOAT",
        help=f"divide a trace's timestamps and delays by this ({', '.join(takes)})",
    )
    for name, kind in DATASETS.items():
        fields = kind.options.model_fields
        if not fields:
            continue
        group = p.add_argument_group(f"{name} dataset options (with --dataset-name {name})")
        for field, info in fields.items():
            default = "" if info.default is None else f" (default {info.default})"
            group.add_argument(
                option_flag(name, field),
                *OPTION_ALIASES.get((name, field), ()),
                type=_flag_type(info.annotation),
                default=argparse.SUPPRESS,
                dest=_option_dest(name, field),
                metavar=_flag_type(info.annotation).__name__.upper(),
                help=f"{info.description or field}{default}",
            )


def endpoint_option_flag(field: str) -> str:
    """The flag of an endpoint's option: ``--<field>``, dashes for underscores
    (``--batch-size``); surfaces sharing an option name share its flag."""
    return "--" + field.replace("_", "-")


def _endpoint_option_dest(field: str) -> str:
    return f"endpoint_option__{field}"


def add_endpoint_option_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per option of the registered surfaces (their ``options`` models)."""
    seen: dict[str, Any] = {}
    for name, kind in ENDPOINTS.items():
        fields = kind.options.model_fields
        if not fields:
            continue
        group = p.add_argument_group(f"{name} endpoint options (with --endpoint {name})")
        for field, info in fields.items():
            flag_type = _flag_type(info.annotation)
            if field in seen:  # another surface's option of the same name: one flag
                if seen[field] is not flag_type:
                    raise TypeError(f"endpoint option {field} has two types")
                continue
            seen[field] = flag_type
            default = "" if info.default is None else f" (default {info.default})"
            group.add_argument(
                endpoint_option_flag(field),
                type=flag_type,
                default=argparse.SUPPRESS,
                dest=_endpoint_option_dest(field),
                metavar=flag_type.__name__.upper(),
                help=f"{info.description or field}{default}",
            )


def endpoint_options_from_args(ns: argparse.Namespace, endpoint: str) -> dict[str, object]:
    """The options given for ``--endpoint``; one of another surface only is a
    ``UsageError`` naming it."""
    kind = ENDPOINTS.get(endpoint)
    own = kind.options.model_fields if kind is not None else {}
    chosen: dict[str, object] = {}
    for name, other in ENDPOINTS.items():
        for field in other.options.model_fields:
            dest = _endpoint_option_dest(field)
            if not hasattr(ns, dest) or field in chosen:
                continue
            if field not in own:
                raise UsageError(
                    f"{endpoint_option_flag(field)}: an option of --endpoint {name}, "
                    f"not of {endpoint}"
                )
            chosen[field] = getattr(ns, dest)
    return chosen


def dataset_options_from_args(ns: argparse.Namespace) -> dict[str, object]:
    """The options given for ``--dataset-name``; one given for another type is a
    ``UsageError`` naming it."""
    chosen: dict[str, object] = {}
    for name, kind in DATASETS.items():
        for field in kind.options.model_fields:
            dest = _option_dest(name, field)
            if not hasattr(ns, dest):
                continue
            if name != ns.dataset_name:
                raise UsageError(
                    f"{option_flag(name, field)}: an option of --dataset-name {name}, "
                    f"not of {ns.dataset_name}"
                )
            chosen[field] = getattr(ns, dest)
    if hasattr(ns, "trace_speedup"):
        if "speedup" not in DATASETS[ns.dataset_name].options.model_fields:
            takes = ", ".join(k for k, d in DATASETS.items() if "speedup" in d.options.model_fields)
            raise UsageError(
                f"{TRACE_SPEEDUP}: an option of --dataset-name {takes}, not of {ns.dataset_name}"
            )
        chosen["speedup"] = ns.trace_speedup
    return chosen


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-url",
        required=True,
        action="append",
        help="target server, e.g. http://127.0.0.1:8000; repeat it for several (--routing)",
    )
    p.add_argument(
        "--model", required=True, help="a model, or a weighted mix: name:weight,name:weight"
    )
    p.add_argument(
        "--routing",
        default="round-robin",
        help="several --base-url: round-robin (by request index) or session (affinity)",
    )
    p.add_argument(
        "--session-header", default="X-Session-ID", help="the header naming a request's session"
    )
    p.add_argument(
        "--endpoint",
        default="chat",
        help="; ".join(f"{k}: {e.summary}" for k, e in ENDPOINTS.items())
        + " (or the path: "
        + ", ".join(PATH_ALIASES)
        + ")",
    )
    p.add_argument(
        "--dataset-name",
        default="random",
        choices=list(DATASETS),
        help="; ".join(f"{k}: {d.summary}" for k, d in DATASETS.items()),
    )
    p.add_argument(
        "--dataset-path",
        default=None,
        help="the dataset file: JSONL prompts (jsonl), ShareGPT JSON (sharegpt; default: "
        "the packaged file of the sharegpt extra)",
    )
    p.add_argument("--input-len", "--random-input-len", type=int, default=256, dest="input_len")
    p.add_argument("--output-len", "--random-output-len", type=int, default=128, dest="output_len")
    p.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="requests (sessions with --multi-turn); default 100, a trace's every line "
        "(mooncake, timed_jsonl)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=None, help="local path of a Hugging Face tokenizer")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--token-counting", default="auto", help="auto | usage | tokenizer")
    p.add_argument("--request-rate", default="inf", help="requests/s, or inf (all at once)")
    p.add_argument("--arrival", default=None, help="poisson | gamma | constant")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument(
        "--processes",
        default="1",
        help="load processes on this host, one run (the schedule dealt to them); auto: the "
        "cores this machine can spare (usable cores less one)",
    )
    p.add_argument(
        "--shards",
        default="1",
        help="with --server: one run dealt over this many workers (1 to 256), started together",
    )
    p.add_argument(
        "--multi-turn",
        action="store_true",
        help="replay each conversation (sharegpt, jsonl) as a session of turns; "
        "--num-prompts counts sessions, --max-concurrency active sessions",
    )
    p.add_argument("--max-turns", type=int, default=None, help="turns per session, at most")
    p.add_argument(
        "--turn-delay-ms", type=float, default=0.0, help="think time after each reply, ms"
    )
    p.add_argument("--num-warmups", "--warmup-requests", type=int, default=0, dest="num_warmups")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument(
        "--connection-mode",
        default="keep-alive",
        help="keep-alive: connections persist across requests (one per concurrency slot); "
        "new: a new connection per request",
    )
    p.add_argument("--max-duration", type=float, default=None, help="whole-run limit, seconds")
    p.add_argument(
        "--goodput", nargs="+", default=[], metavar="KEY:MS", help="SLOs, e.g. ttft:150 e2el:2000"
    )
    p.add_argument("--client-lag-bound-ms", type=float, default=10.0)
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=0.05,
        help="a run (or sweep step) with a higher error rate ends partial: exit 1",
    )
    p.add_argument(
        "--clock",
        choices=("auto", "userspace"),
        default="auto",
        help="receive stamps: auto = kernel (SO_TIMESTAMPNS) where available, else user-space",
    )
    p.add_argument(
        "--realtime",
        action="store_true",
        help="run the load thread at real-time priority (SCHED_FIFO; needs root or CAP_SYS_NICE)",
    )
    p.add_argument(
        "--metrics-url",
        default=None,
        help="the target's Prometheus /metrics to scrape (default: BASE_URL/metrics)",
    )
    p.add_argument(
        "--no-scrape-metrics",
        action="store_true",
        help="do not scrape the target's /metrics during the run",
    )
    p.add_argument(
        "--reset-prefix-cache",
        action="store_true",
        help="empty the server's (each target's) prefix cache after the warm-ups, before the "
        "measured requests (vLLM POST /reset_prefix_cache, SGLang POST /flush_cache); a sweep: "
        "before each step",
    )
    p.add_argument(
        "--server-profile",
        action="store_true",
        help="run the server's (each target's) profiler over the measured window (POST "
        "/start_profile, /stop_profile; vLLM needs VLLM_TORCH_PROFILER_DIR); the trace's path "
        "is recorded",
    )
    p.add_argument("--extra-body", default=None, help="JSON object merged into each request")
    p.add_argument("--temperature", type=float, default=None, help="sampling, into the body")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument(
        "--header",
        action="append",
        default=[],
        dest="headers",
        metavar="K:V",
        help="an HTTP header sent on every request (repeatable); secret-looking names are "
        "refused: use --api-key or --api-key-env",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="ask for one JSON response (stream false): TTFT is then E2E, no ITL",
    )
    p.add_argument("--ramp-up-strategy", default=None, help="linear | exponential (vLLM's)")
    p.add_argument("--ramp-up-start-rps", type=float, default=None)
    p.add_argument("--ramp-up-end-rps", type=float, default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--api-key-env",
        default=None,
        help="read the key from this variable (TOKENTRACE_TARGET_KEY_<NAME>) where the load "
        "runs: with --server, on the worker, so the dashboard never sees it; it is sent only "
        "to the targets listed in TOKENTRACE_TARGET_KEY_<NAME>_TARGETS there (URL prefixes "
        "or host:port, comma-separated)",
    )
    p.add_argument("--engine", default=None, help="server engine, recorded (e.g. vllm)")
    p.add_argument("--engine-version", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--engine-flags", default=None, help="server flags, recorded for reproduction")
    p.add_argument("--tag", action="append", default=[], dest="tags")
    p.add_argument("--name", default=None, help="a name for the saved run")
    p.add_argument(
        "--series",
        default=None,
        metavar="NAME",
        help="the named series the run (a sweep: its steps) joins, [A-Za-z0-9._-]{1,100}",
    )
    p.add_argument("--no-save", action="store_true", help="do not save the run to the database")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument(
        "--profile",
        nargs="?",
        const=SERVER_PROFILE,
        default=None,
        metavar="DEFINITIONS",
        help="alone: profile the server over the measured window (as --server-profile); "
        "with vllm | guidellm | aiperf: also show that tool's metric definitions",
    )
    p.add_argument("--database-url", default=None, help="overrides TOKENTRACE_DATABASE_URL")
    p.add_argument(
        "--server", default=None, help="submit to a tokentrace dashboard (URL) and follow it"
    )
    p.add_argument("--token", default=None, help="API token for --server (scope run)")
    add_dataset_option_arguments(p)
    add_endpoint_option_arguments(p)


def parse_goodput(items: list[str]) -> dict[str, float]:
    slos: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep:
            raise UsageError(f"--goodput: expected KEY:MS, got {item!r}")
        known = slo_metrics()
        if key not in known:
            raise UsageError(f"--goodput: unknown SLO {key!r} (use {', '.join(known)})")
        try:
            slos[key] = float(value)
        except ValueError:
            raise UsageError(f"--goodput: {key} needs a number of ms, got {value!r}") from None
    return slos


def parse_headers(items: list[str]) -> dict[str, str]:
    """``--header K:V`` items as a dict (the value stripped of surrounding spaces)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise UsageError("--header: expected K:V (a name, a colon, then the value)")
        out[key.strip()] = value.strip()
    return out


def _endpoint(raw: str) -> str:
    return PATH_ALIASES.get(raw, raw)


def _rate(raw: str) -> float:
    try:
        return math.inf if raw.lower() == "inf" else float(raw)
    except ValueError:
        raise UsageError(f"--request-rate: expected a number or inf, got {raw!r}") from None


def spec_from_args(ns: argparse.Namespace) -> RunSpec:
    """Build and validate a RunSpec; raises UsageError naming the offending flag."""
    extra: dict[str, object] = {}
    if ns.extra_body:
        try:
            loaded = json.loads(ns.extra_body)
        except ValueError as e:
            raise UsageError(f"--extra-body: not JSON ({e})") from None
        if not isinstance(loaded, dict):
            raise UsageError("--extra-body: must be a JSON object")
        extra = loaded
    rate = _rate(ns.request_rate)
    arrival = ns.arrival or "poisson"
    if ns.arrival is None and ns.burstiness != 1.0:
        arrival = "gamma"
    endpoint = _endpoint(ns.endpoint)
    fields: dict[str, object] = {
        "base_url": ns.base_url[0],
        "base_urls": ns.base_url if len(ns.base_url) > 1 else [],
        "routing": ns.routing,
        "session_header": ns.session_header,
        "model": ns.model,
        "endpoint": endpoint,
        "endpoint_options": endpoint_options_from_args(ns, endpoint),
        "dataset": ns.dataset_name,
        "dataset_path": ns.dataset_path,
        "dataset_options": dataset_options_from_args(ns),
        "input_len": ns.input_len,
        "output_len": ns.output_len,
        "num_prompts": ns.num_prompts,
        "seed": ns.seed,
        "tokenizer": ns.tokenizer,
        "ignore_eos": ns.ignore_eos,
        "token_counting": ns.token_counting,
        "request_rate": rate,
        "arrival": arrival,
        "burstiness": ns.burstiness,
        "max_concurrency": ns.max_concurrency,
        "processes": getattr(ns, "processes", 1),
        "shards": getattr(ns, "shards", 1),
        "multi_turn": ns.multi_turn,
        "max_turns": ns.max_turns,
        "turn_delay_ms": ns.turn_delay_ms,
        "warmup_requests": ns.num_warmups,
        "request_timeout_s": ns.request_timeout,
        "connection_mode": ns.connection_mode,
        "max_duration_s": ns.max_duration,
        "goodput": parse_goodput(ns.goodput),
        "client_lag_bound_ms": ns.client_lag_bound_ms,
        "max_error_rate": ns.max_error_rate,
        "metrics_url": ns.metrics_url,
        "scrape_metrics": not ns.no_scrape_metrics,
        "reset_prefix_cache": ns.reset_prefix_cache,
        "server_profile": ns.server_profile or ns.profile == SERVER_PROFILE,
        "extra_body": extra,
        "temperature": ns.temperature,
        "top_p": ns.top_p,
        "top_k": ns.top_k,
        "min_p": ns.min_p,
        "repetition_penalty": ns.repetition_penalty,
        "frequency_penalty": ns.frequency_penalty,
        "presence_penalty": ns.presence_penalty,
        "headers": parse_headers(ns.headers),
        "stream": not ns.no_stream,
        "ramp_up_strategy": ns.ramp_up_strategy,
        "ramp_up_start_rps": ns.ramp_up_start_rps,
        "ramp_up_end_rps": ns.ramp_up_end_rps,
        "api_key": ns.api_key,
        "api_key_env": ns.api_key_env,
        "engine": ns.engine,
        "engine_version": ns.engine_version,
        "dtype": ns.dtype,
        "engine_flags": ns.engine_flags,
        "tags": ns.tags,
    }
    try:
        spec = RunSpec.model_validate(fields)
    except ValidationError as e:
        raise UsageError(describe_validation_error(e, ns.dataset_name)) from None
    if spec.shards != 1 and not getattr(ns, "server", None):
        raise UsageError(
            "--shards: a run dealt over workers needs --server (one host: --processes)"
        )
    return spec


_OPTION_ERROR = re.compile(r"dataset_options\.(\w+): (.*)", re.DOTALL)
_ENDPOINT_OPTION_ERROR = re.compile(r"endpoint_options\.(\w+): (.*)", re.DOTALL)
_LEADING_FIELD = re.compile(r"(\w+): (.*)", re.DOTALL)


_LEADING_NAME = re.compile(r"(dataset_options\.)?(\w+)(.*)", re.DOTALL)


def flagged(message: str, dataset: str) -> str:
    """A message that starts with a spec field (``dataset_path line 3: ...``,
    ``dataset_options.speedup: ...``) starting with its flag instead."""
    m = _LEADING_NAME.match(message)
    if m is None:
        return message
    if m[1]:
        return option_flag(dataset, m[2]) + m[3]
    flag = FLAG_FOR_FIELD.get(m[2])
    return flag + m[3] if flag else message


def describe_validation_error(e: ValidationError, dataset: str | None = None) -> str:
    err = e.errors()[0]
    loc = err.get("loc", ())
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    option = _OPTION_ERROR.match(msg)
    if option and dataset is not None:  # a dataset type's option: its flag
        return f"{option_flag(dataset, option[1])}: {option[2]}"
    surface_option = _ENDPOINT_OPTION_ERROR.match(msg)
    if surface_option:  # an endpoint's option: its flag
        return f"{endpoint_option_flag(surface_option[1])}: {surface_option[2]}"
    lead = _LEADING_FIELD.match(msg)
    if not loc and lead and lead[1] in FLAG_FOR_FIELD:  # "field: reason" across fields
        return f"{FLAG_FOR_FIELD[lead[1]]}: {lead[2]}"
    field = str(loc[0]) if loc else ""
    msg = msg.removeprefix(f"{field}: ") if field else msg  # the flag is said once, below
    if not field:  # a check across fields: name the first field its message mentions
        words = set(re.findall(r"\w+", msg))
        field = next((f for f in FLAG_FOR_FIELD if f in words), "")
    for name, flag in FLAG_FOR_FIELD.items():
        msg = re.sub(rf"\b{name}\b", flag, msg) if " " in msg else msg
    return f"{FLAG_FOR_FIELD.get(field, field or 'spec')}: {msg}"


def check_series(name: str | None, flag: str = "--series") -> str | None:
    """A series name given on the command line, checked (``UsageError``: exit 2)."""
    if name is None:
        return None
    from app.analysis.series import check_name

    try:
        return check_name(name)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def check_local_key(spec: RunSpec) -> None:
    """A load run here (not ``--server``): its ``--api-key-env`` key must be set here and
    bound to the target (``app.client.target_keys``); else a ``UsageError`` (exit 2)."""
    if not spec.api_key_env:
        return
    from app.client.target_keys import resolve_api_key

    try:
        resolve_api_key(spec)
    except ValueError as e:
        raise UsageError(str(e).replace("api_key_env", "--api-key-env", 1)) from None
