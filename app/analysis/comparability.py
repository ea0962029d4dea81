"""The comparability key: what must match for two runs to be compared (SPEC §7.5).

A comparison changes one variable at a time. The key of a run lists the fields that define
its workload and setup: model, engine and version, dtype, input and output length
distributions (spec lengths and the measured median lengths), dataset (and whether its
conversations were replayed as multi-turn sessions: turn cap, think time), its own options
(``dataset_options``: a range ratio, a shared prefix, ShareGPT's filters ...) and the file
it read (the packaged ShareGPT version or the file's sha256, from the run's load
statistics), seed, load shape, endpoint (and its own options, ``endpoint_options``) and
hardware, and the **target**: the server the run measured, as its normalised base URL and
the identity the server gave (the engine its ``/metrics`` names, the models its
``/v1/models`` lists; ``target_key``). A run of several models (``model_mix``) has its mix
as its model (``model_text``: each model's share of the weights), a run of several targets
(``base_urls``) their URLs and its routing as its target's URL (``targets_url``). ``check`` reports
every field where the runs differ; when more than the one variable under test differs, a
comparison must say so before any verdict. A variable under test that makes another server
(model, engine, its version, dtype, hardware: ``SERVER_FIELDS``) lets the target differ with
it, and the message says that it does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# field -> label, in the order they are shown
KEY_FIELDS: dict[str, str] = {
    "target": "target (URL and server identity)",
    "model": "model",
    "engine": "engine",
    "engine_version": "engine version",
    "dtype": "dtype",
    "input_len": "input length (spec)",
    "output_len": "output length (spec)",
    "ignore_eos": "ignore_eos",
    "measured_input_p50": "measured input length p50",
    "measured_output_p50": "measured output length p50",
    "dataset": "dataset",
    "dataset_options": "dataset options",
    "dataset_source": "dataset file (version or sha256)",
    "seed": "seed",
    "load_shape": "load shape",
    "sampling": "sampling parameters",
    "stream": "streamed",
    "endpoint": "endpoint",
    "connections": "connections (kept alive, or new per request)",
    "hardware": "hardware",
}
# measured lengths within this relative tolerance count as equal
LENGTH_TOLERANCE = 0.05
# fields allowed to differ in a sweep-to-sweep comparison is none; within a sweep: load shape
MEASURED = ("measured_input_p50", "measured_output_p50")
# unknown on one side (None) contradicts nothing
OPTIONAL = ("connections", "dataset_source", "stream")
# dataset types that give each request's send time (app.client.datasets: ``timed``)
TIMED_DATASETS = ("mooncake", "timed_jsonl")
# a variable under test that is another server: the target may differ with it
SERVER_FIELDS = ("model", "engine", "engine_version", "dtype", "hardware")
# the engine a server's /metrics names, by its series' prefix (app.protocol.prometheus)
ENGINE_PREFIXES: dict[str, str] = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp"}
SHOWN_MODELS = 5  # served model ids shown in a target's text (all are compared)
SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
    "presence_penalty",
)  # fmt: skip


def load_shape(spec: Mapping[str, Any]) -> str:
    """The load shape as text: rate (arrival, burstiness), a ramp-up or a trace's own
    schedule, and concurrency cap."""
    rate = spec.get("request_rate")
    ramp = spec.get("ramp_up_strategy")
    if spec.get("dataset") in TIMED_DATASETS:
        rate_text = "the trace's schedule"
    elif ramp:
        start, end = spec.get("ramp_up_start_rps"), spec.get("ramp_up_end_rps")
        rate_text = f"{ramp} ramp {float(start or 0):g}->{float(end or 0):g} req/s"
        rate_text += f" {spec.get('arrival') or 'poisson'}"
    elif rate is None or (isinstance(rate, float) and math.isinf(rate)):
        rate_text = "all at once"
    else:
        rate_text = f"{float(rate):g} req/s {spec.get('arrival') or 'poisson'}"
        burst = spec.get("burstiness")
        if burst not in (None, 1, 1.0):
            rate_text += f" burstiness {float(burst):g}"
    conc = spec.get("max_concurrency")
    return rate_text + (f", concurrency <= {conc}" if conc else "")


def dataset_text(spec: Mapping[str, Any]) -> str:
    """The dataset type and file, and for multi-turn sessions their turn cap and think time
    (the same conversations replayed as sessions are another workload)."""
    ds = str(spec.get("dataset") or "random")
    text = f"{ds}:{spec['dataset_path']}" if spec.get("dataset_path") else ds
    if spec.get("multi_turn"):
        turns = spec.get("max_turns")
        think = float(spec.get("turn_delay_ms") or 0.0)
        text += f", multi-turn sessions ({f'at most {turns}' if turns else 'all'} turns"
        text += f", think {think:g} ms)"
    return text


def dataset_options_text(spec: Mapping[str, Any]) -> str:
    """The dataset type's own options as ``k=v`` pairs in name order ("" when none: the
    spec stores only options that differ from the type's defaults)."""
    opts = spec.get("dataset_options") or {}
    return ", ".join(f"{k}={opts[k]}" for k in sorted(opts))


def endpoint_text(spec: Mapping[str, Any]) -> str | None:
    """The API surface and its own options (``embeddings (batch_size=16)``): a batch of 16
    inputs per request is another workload than one."""
    name = spec.get("endpoint")
    opts = spec.get("endpoint_options") or {}
    if name is None or not isinstance(opts, Mapping) or not opts:
        return None if name is None else str(name)
    return f"{name} ({', '.join(f'{k}={opts[k]}' for k in sorted(opts))})"


def sampling_text(spec: Mapping[str, Any]) -> str:
    """The sampling parameters a run set, as ``k=v`` pairs ("" when none: the server's)."""
    return ", ".join(f"{k}={spec[k]}" for k in SAMPLING_FIELDS if spec.get(k) is not None)


def connection_mode(spec: Mapping[str, Any]) -> str | None:
    """How the run's client used connections: "keep-alive" or "new". Runs saved before the
    setting existed opened a new connection per request; imports don't say (None)."""
    mode = spec.get("connection_mode")
    if mode is not None:
        return str(mode)
    return "new" if "request_timeout_s" in spec else None  # a RunSpec from before the field


MAX_URL_CHARS = 2048
MAX_MODELS = 256  # served model ids kept in a target's key (sorted; their count beside)
MAX_SERIES = 1000  # scraped series names read for the engine
_CREDENTIALS = re.compile(r"(?<=://)[^/?#]*@")


def target_url(url: Any) -> str | None:
    """A base URL normalised for comparison: scheme and host lower case, the port explicit
    (80 for http, 443 for https), the path without its trailing slash and final ``/v1`` (the
    client adds ``/v1`` itself, so ``http://h:8000`` and ``http://h:8000/v1/`` are one
    target); never credentials, query or fragment. A URL without a scheme (AIPerf writes
    ``localhost:8000``) is taken as http; one that does not parse is kept as written, less
    any ``user:password@``. None when there is none."""
    if not isinstance(url, str) or not url.strip():
        return None
    text = url.strip()[:MAX_URL_CHARS]
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return _CREDENTIALS.sub("", text, count=1)
    if not host:
        return _CREDENTIALS.sub("", text, count=1)
    scheme = parts.scheme.lower()
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    host = f"[{host}]" if ":" in host else host
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1").rstrip("/")
    return f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"


def engine_of(load_stats: Mapping[str, Any] | None) -> str | None:
    """The engine the target's ``/metrics`` named (``vllm``, ``sglang``, ``llama.cpp``: the
    prefix of the series scraped), "a + b" for several; None when nothing was scraped."""
    scrape = (load_stats or {}).get("server_metrics")
    names = scrape.get("series") if isinstance(scrape, Mapping) else None
    if not isinstance(names, list):
        return None
    found = {
        engine
        for name in names[:MAX_SERIES]
        if isinstance(name, str)
        for prefix, engine in ENGINE_PREFIXES.items()
        if name.startswith(prefix)
    }
    return " + ".join(sorted(found)) if found else None


def served_models(load_stats: Mapping[str, Any] | None) -> list[str] | None:
    """The model ids the target's ``/v1/models`` listed at the run's start, sorted, each
    once, each cut at 200 characters (``target_key`` keeps ``MAX_MODELS`` of them and their
    count); None when not listed."""
    ids = (load_stats or {}).get("served_models")
    if not isinstance(ids, list):
        return None
    return sorted({m[:200] for m in ids if isinstance(m, str)})


def model_text(spec: Mapping[str, Any]) -> Any:
    """The run's model, or its mix as ``name:share,...`` (shares of the weights' sum, so
    ``a:7,b:3`` and ``a:0.7,b:0.3`` are one mix), in the order given."""
    mix = spec.get("model_mix")
    if not isinstance(mix, list) or not mix:
        return spec.get("model")
    pairs = [(str(m.get("model")), float(m.get("weight") or 0)) for m in mix if isinstance(m, dict)]
    total = sum(w for _, w in pairs) or 1.0
    return ",".join(f"{name}:{w / total:.4g}" for name, w in pairs)


def targets_url(spec: Mapping[str, Any]) -> str | None:
    """A run of several targets: their normalised URLs in order and its routing, as one
    text (``a + b (round-robin)``); None for a run of one."""
    urls = spec.get("base_urls")
    if not isinstance(urls, list) or len(urls) < 2:
        return None
    joined = " + ".join(str(target_url(u)) for u in urls)
    return f"{joined} ({spec.get('routing') or 'round-robin'})"


def target_key(url: Any, load_stats: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The target of a run: its normalised URL (``target_url``), the engine its ``/metrics``
    named and the models its ``/v1/models`` listed (with their count); each None when the run
    did not record it, and None when it recorded none of them."""
    models = served_models(load_stats)
    out = {
        "url": target_url(url),
        "engine": engine_of(load_stats),
        "models": None if models is None else models[:MAX_MODELS],
        "models_count": None if models is None else len(models),
    }
    return out if any(v is not None for v in out.values()) else None


def target_text(target: Mapping[str, Any] | None) -> str | None:
    """A target as one line: "http://h:8000 · vllm /metrics · serves m1, m2"."""
    if not target:
        return None
    parts = [str(target.get("url") or "URL unknown")]
    if target.get("engine"):
        parts.append(f"{target['engine']} /metrics")
    models = target.get("models")
    if models is not None:
        count = int(target.get("models_count") or len(models))
        shown = ", ".join(str(m) for m in models[:SHOWN_MODELS]) or "no model"
        more = count - min(len(models), SHOWN_MODELS)
        parts.append(f"serves {shown}" + (f" (+{more} more)" if more > 0 else ""))
    return " · ".join(parts)


def comparability_key(
    spec: Mapping[str, Any],
    *,
    measured_input_p50: float | None = None,
    measured_output_p50: float | None = None,
    hardware: str | None = None,
    load: str | None = None,
    dataset_source: str | None = None,
    url: str | None = None,
    load_stats: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The key of one run from its spec (a ``RunSpec`` dumped to JSON) and measurements.

    ``load`` overrides the load shape (a sweep's key uses its list of loads);
    ``dataset_source``: the file its prompts came from (``load_stats["dataset_source"]``);
    ``url``: the target's URL when the spec has none (an import's); ``load_stats``: the run's
    load statistics, for the server's identity (``target_key``)."""
    target = target_key(spec.get("base_url") or url, load_stats)
    several = targets_url(spec)
    if several is not None and target is not None:
        target["url"] = several
    return {
        "target": target,
        "model": model_text(spec),
        "engine": spec.get("engine"),
        "engine_version": spec.get("engine_version"),
        "dtype": spec.get("dtype"),
        "input_len": spec.get("input_len")
        if (spec.get("dataset") or "random") == "random"
        else None,
        "output_len": spec.get("output_len"),
        "ignore_eos": spec.get("ignore_eos"),
        "measured_input_p50": measured_input_p50,
        "measured_output_p50": measured_output_p50,
        "dataset": dataset_text(spec),
        "dataset_options": dataset_options_text(spec),
        "dataset_source": dataset_source,
        "seed": spec.get("seed"),
        "load_shape": load if load is not None else load_shape(spec),
        "sampling": sampling_text(spec),
        "stream": spec.get("stream"),
        "endpoint": endpoint_text(spec),
        "connections": connection_mode(spec),
        "hardware": hardware,
    }


def _same_target(a: Any, b: Any) -> bool:
    """Two targets are one unless a part both recorded differs (URL, engine, models)."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return True  # unknown on one side: nothing to contradict
    for part in ("url", "engine", "models"):
        x, y = a.get(part), b.get(part)
        if x is not None and y is not None and x != y:
            return False
    count_a, count_b = a.get("models_count"), b.get("models_count")
    return count_a is None or count_b is None or count_a == count_b


def _same(field: str, a: Any, b: Any) -> bool:
    if field == "target":
        return _same_target(a, b)
    if field in OPTIONAL and (a is None or b is None):
        return True
    if field in MEASURED:
        if a is None or b is None:
            return True  # unknown on one side: nothing to contradict
        if a == b:
            return True
        scale = max(abs(float(a)), abs(float(b)))
        return scale > 0 and abs(float(a) - float(b)) / scale <= LENGTH_TOLERANCE
    return bool(a == b)


def shown(field: str, value: Any) -> Any:
    """A key field's value as a comparison shows it (a target as one line of text)."""
    return target_text(value) if field == "target" else value


@dataclass(frozen=True, slots=True)
class FieldDiff:
    field: str
    label: str
    values: list[Any]  # one per run, in the order given, as shown (``shown``)

    def to_dict(self, expected: bool = False) -> dict[str, Any]:
        return {
            "field": self.field,
            "label": self.label,
            "values": list(self.values),
            "expected": expected,
        }


def allowed_to_differ(variable: str | None) -> set[str]:
    """The fields that may differ when ``variable`` is under test: itself, and the target
    when it is another server (``SERVER_FIELDS``)."""
    if variable is None:
        return set()
    return {variable, "target"} if variable in SERVER_FIELDS else {variable}


@dataclass(frozen=True, slots=True)
class Comparability:
    differing: list[FieldDiff]
    variable: str | None  # the one field under test (given, or inferred)
    comparable: bool  # at most the variable under test (and what it allows) differs

    @property
    def unexpected(self) -> list[FieldDiff]:
        allowed = allowed_to_differ(self.variable)
        return [d for d in self.differing if d.field not in allowed]

    def target_note(self) -> str | None:
        """The note "target differs: A vs B" when the runs measured different servers."""
        diff = next((d for d in self.differing if d.field == "target"), None)
        if diff is None:
            return None
        return "target differs: " + " vs ".join(str(v or "unknown") for v in diff.values)

    def message(self) -> str:
        if not self.differing:
            return "same workload and setup: every key field matches"
        note = self.target_note()
        if self.comparable:
            assert self.variable is not None
            text = f"one variable under test: {KEY_FIELDS[self.variable]}"
            if note is None:
                return text
            return f"{text}; {note}" if self.variable == "target" else f"{text}; with it the {note}"
        names = ", ".join(d.label for d in self.unexpected)
        text = f"not a one-variable comparison: the runs also differ in {names}"
        if note is not None:
            text += f"; {note}"
        return f"{text}; read the verdicts with care"

    def to_dict(self) -> dict[str, Any]:
        allowed = allowed_to_differ(self.variable)
        return {
            "comparable": self.comparable,
            "variable": self.variable,
            "message": self.message(),
            "differing": [d.to_dict(d.field in allowed) for d in self.differing],
        }


def _infer(diffs: list[FieldDiff]) -> str | None:
    """The variable under test when none is given: the one field that differs (beside the
    target, when it is another server), or the target when only it differs."""
    others = [d.field for d in diffs if d.field != "target"]
    if len(others) == 1 and (len(diffs) == 1 or others[0] in SERVER_FIELDS):
        return others[0]
    if not others and diffs:
        return "target"
    return None


def check(keys: Sequence[Mapping[str, Any]], *, variable: str | None = None) -> Comparability:
    """Which key fields differ between any of ``keys`` (the first is the reference).

    ``variable``: the field under test (it may differ, and the target with a server field).
    Without it, a single differing field is taken as the variable under test (a server
    field with the target beside it too); more make the comparison not comparable.
    """
    if variable is not None and variable not in KEY_FIELDS:
        raise ValueError(f"unknown key field {variable!r}; expected one of {list(KEY_FIELDS)}")
    if len(keys) < 2:
        return Comparability([], variable, True)
    ref = keys[0]
    diffs = [
        FieldDiff(f, label, [shown(f, k.get(f)) for k in keys])
        for f, label in KEY_FIELDS.items()
        if any(not _same(f, ref.get(f), k.get(f)) for k in keys[1:])
    ]
    if variable is None:
        variable = _infer(diffs)
    allowed = allowed_to_differ(variable)
    return Comparability(diffs, variable, all(d.field in allowed for d in diffs))
