"""The comparability key: what must match for two runs to be compared (SPEC §7.5).

A comparison changes one variable at a time. The key of a run lists the fields that define
its workload and setup: model, engine and version, dtype, input and output length
distributions (spec lengths and the measured median lengths), dataset (and whether its
conversations were replayed as multi-turn sessions: turn cap, think time), its own options
(``dataset_options``: a range ratio, a shared prefix, ShareGPT's filters ...) and the file
it read (the packaged ShareGPT version or the file's sha256, from the run's load
statistics), seed, load shape, endpoint and hardware. ``check`` reports every field where
the runs differ; when more than the one variable under test differs, a comparison must say
so before any verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# field -> label, in the order they are shown
KEY_FIELDS: dict[str, str] = {
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


def comparability_key(
    spec: Mapping[str, Any],
    *,
    measured_input_p50: float | None = None,
    measured_output_p50: float | None = None,
    hardware: str | None = None,
    load: str | None = None,
    dataset_source: str | None = None,
) -> dict[str, Any]:
    """The key of one run from its spec (a ``RunSpec`` dumped to JSON) and measurements.

    ``load`` overrides the load shape (a sweep's key uses its list of loads);
    ``dataset_source``: the file its prompts came from (``load_stats["dataset_source"]``)."""
    return {
        "model": spec.get("model"),
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
        "endpoint": spec.get("endpoint"),
        "connections": connection_mode(spec),
        "hardware": hardware,
    }


def _same(field: str, a: Any, b: Any) -> bool:
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


@dataclass(frozen=True, slots=True)
class FieldDiff:
    field: str
    label: str
    values: list[Any]  # one per run, in the order given

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "label": self.label, "values": list(self.values)}


@dataclass(frozen=True, slots=True)
class Comparability:
    differing: list[FieldDiff]
    variable: str | None  # the one field under test (given, or the only one differing)
    comparable: bool  # at most the variable under test differs

    @property
    def unexpected(self) -> list[FieldDiff]:
        return [d for d in self.differing if d.field != self.variable]

    def message(self) -> str:
        if not self.differing:
            return "same workload and setup: every key field matches"
        if self.comparable:
            assert self.variable is not None
            return f"one variable under test: {KEY_FIELDS[self.variable]}"
        names = ", ".join(d.label for d in self.unexpected)
        return (
            f"not a one-variable comparison: the runs also differ in {names}; "
            "read the verdicts with care"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "comparable": self.comparable,
            "variable": self.variable,
            "message": self.message(),
            "differing": [d.to_dict() for d in self.differing],
        }


def check(keys: Sequence[Mapping[str, Any]], *, variable: str | None = None) -> Comparability:
    """Which key fields differ between any of ``keys`` (the first is the reference).

    ``variable``: the field under test (it may differ). Without it, a single differing field
    is taken as the variable under test; two or more make the comparison not comparable.
    """
    if variable is not None and variable not in KEY_FIELDS:
        raise ValueError(f"unknown key field {variable!r}; expected one of {list(KEY_FIELDS)}")
    if len(keys) < 2:
        return Comparability([], variable, True)
    ref = keys[0]
    diffs = [
        FieldDiff(f, label, [k.get(f) for k in keys])
        for f, label in KEY_FIELDS.items()
        if any(not _same(f, ref.get(f), k.get(f)) for k in keys[1:])
    ]
    if variable is None and len(diffs) == 1:
        variable = diffs[0].field
    unexpected = [d for d in diffs if d.field != variable]
    return Comparability(diffs, variable, not unexpected)
