"""The Prometheus text exposition format, and which server series tokentrace keeps. Pure.

``parse_text`` reads every sample with ``prometheus_client``'s parser (``# TYPE`` lines give
kinds). ``select`` keeps the series that matter for reading a run: requests running and
waiting, KV-cache usage, preemptions, prompt and generation token counters, the server's own
prefill and decode time (llama.cpp's ``prompt_seconds_total`` /
``tokens_predicted_seconds_total``; the ``_sum`` and ``_count`` of vLLM's
``request_prefill_time_seconds`` / ``request_decode_time_seconds`` histograms), vLLM's
prefix-cache query and hit counters, under vLLM,
SGLang and llama.cpp names, plus any extra names the user configures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# tokentrace's role for a series -> the names servers use for it
KNOWN_SERIES: dict[str, tuple[str, ...]] = {
    "running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ),
    "waiting": (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    ),
    "kv_cache_usage": (
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "sglang:token_usage",
    ),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": (
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
    # the server's own time: seconds spent on prompts (prefill) and on generating (decode)
    "prefill_seconds": (
        "llamacpp:prompt_seconds_total",
        "vllm:request_prefill_time_seconds_sum",
    ),
    "decode_seconds": (
        "llamacpp:tokens_predicted_seconds_total",
        "vllm:request_decode_time_seconds_sum",
    ),
    # prompt tokens looked up in the prefix cache and those found there (vLLM)
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefill_requests": ("vllm:request_prefill_time_seconds_count",),
    "decode_requests": ("vllm:request_decode_time_seconds_count",),
}
ROLE_OF: dict[str, str] = {name: role for role, names in KNOWN_SERIES.items() for name in names}


class PrometheusFormatError(ValueError):
    """A line of the exposition is not valid; the message names it."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(slots=True)
class Series:
    """One scraped series: sample times on the run's monotonic axis (ns) and values."""

    name: str
    labels: dict[str, str]
    kind: str | None = None
    t_ns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def role(self) -> str | None:
        return ROLE_OF.get(self.name)

    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return self.name, tuple(sorted(self.labels.items()))


def _families(text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, KeyError):
        raise PrometheusFormatError(_first_bad_line(text)) from None


def _first_bad_line(text: str) -> str:
    """Which line the parser refused (it says only what it could not read)."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(s + "\n"))
        except (ValueError, TypeError, IndexError, KeyError):
            return f"line {line_no}: not a sample: {s[:80]!r}"
    return "not the Prometheus text format"


def parse_label_set(raw: str, line_no: int) -> tuple[tuple[str, str], ...]:
    """A ``{name="value",...}`` label set, sorted by name."""
    try:
        [family] = list(text_string_to_metric_families(f"x{raw} 0\n"))
        [sample] = family.samples
    except (ValueError, TypeError, IndexError, KeyError):
        raise PrometheusFormatError(f"line {line_no}: bad label set {raw!r}") from None
    return tuple(sorted(sample.labels.items()))


def parse_text(text: str) -> tuple[list[Sample], dict[str, str]]:
    """All samples of an exposition (``prometheus_client``'s parser reads it) and the kind
    (``# TYPE``) of each sample name whose family declares one."""
    samples: list[Sample] = []
    kinds: dict[str, str] = {}
    for family in _families(text):
        for s in family.samples:
            if family.type != "unknown":
                kinds[s.name] = family.type
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return samples, kinds


def wanted(names: Iterable[str] = ()) -> frozenset[str]:
    """The series names scraped by default plus ``names``."""
    return frozenset(ROLE_OF) | frozenset(n.strip() for n in names if n.strip())


def kind_of(name: str, kinds: dict[str, str]) -> str | None:
    if name in kinds:
        return kinds[name]
    for suffix in ("_total", "_created", "_sum", "_count", "_bucket"):
        if name.endswith(suffix) and name[: -len(suffix)] in kinds:
            return kinds[name[: -len(suffix)]]
    return None


def select(samples: list[Sample], names: frozenset[str]) -> list[Sample]:
    """The samples whose metric name is in ``names`` (NaN values dropped: JSON has none)."""
    return [s for s in samples if s.name in names and not math.isnan(s.value)]


def add_scrape(
    series: dict[tuple[str, tuple[tuple[str, str], ...]], Series],
    t_ns: int,
    samples: list[Sample],
    kinds: dict[str, str],
) -> None:
    """Append one scrape's samples (taken at ``t_ns``) to ``series`` (keyed by name+labels)."""
    for s in samples:
        key = (s.name, s.labels)
        ser = series.get(key)
        if ser is None:
            ser = series[key] = Series(s.name, dict(s.labels), kind_of(s.name, kinds))
        ser.t_ns.append(t_ns)
        ser.values.append(s.value)


def counter_rate(t_ns: list[int], values: list[float]) -> tuple[list[float], list[float]]:
    """Per-second increase of a counter between consecutive samples (resets skipped): the
    midpoint time (s) and rate of each interval."""
    xs: list[float] = []
    ys: list[float] = []
    for i in range(1, len(t_ns)):
        dt = (t_ns[i] - t_ns[i - 1]) / 1e9
        dv = values[i] - values[i - 1]
        if dt <= 0 or dv < 0:
            continue
        xs.append((t_ns[i] + t_ns[i - 1]) / 2e9)
        ys.append(dv / dt)
    return xs, ys


def counter_increase(values: list[float]) -> float:
    """How much a counter rose over its samples (a drop is a reset: counted from 0)."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total
