"""What one metric is: ``Metric``, the definition every view reads (its key, names, unit,
decimals, how it is computed, where it is stored and shown, its SLO), and the two things a
compute reads: ``RunBasis`` (one run's columnar trace, per-request arrays built once) and
``RunTotals`` (the run's counts and window, for one-number-per-run metrics).

A compute is vectorised over the run's requests or events (numpy, no loop per request):

* ``per_request(basis)``: one value per request of the trace, in the unit's base (ns for
  ms: ``per_unit``), NaN where undefined (a failed request, a request without the
  events the metric needs); ``None`` when the run did not record what the metric needs
  (``requires``: user-perceived TTFT without connection phases);
* ``pooled(basis)``: the distribution of samples pooled over the run (ITL per token), in
  the unit; ``samples(basis)``: those samples in the unit, for figures and comparisons;
* ``per_run(totals)``: one number per run (a throughput), or None without a window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.analysis.answers import answer_end_times, has_answers
from app.analysis.event_views import (
    NS_PER_MS,
    EventView,
    ItlSamples,
    content_view,
    event_view,
    itl_samples,
    output_token_counts,
    since_sent,
    valid_requests,
)
from app.analysis.percentiles import Distribution, summarize
from app.analysis.run_counts import Window
from app.domain import RunTrace

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

Aggregation = Literal["per_request", "per_token_pooled", "per_chunk_pooled", "per_run"]
AGG_SHORT: Mapping[str, str] = {
    "per_request": "request",
    "per_token_pooled": "token",
    "per_chunk_pooled": "chunk",
    "per_run": "run",
}
AGG_TEXT: Mapping[str, str] = {  # as the definition profiles word it
    "per_request": "per request",
    "per_token_pooled": "per token, pooled",
    "per_chunk_pooled": "per chunk, pooled",
    "per_run": "run",
}
# the views that show a chosen set of metrics (every metric is in the report, the CLI's
# tables, the exports when it has per-request values, and the series' trends):
# page: the run page's latency table; figures: its CDF and histogram tabs; live: the live
# panel and its time series; table: the requests table (sort, filter; needs a column);
# compare: run and sweep comparisons (needs compare_seed); sweep: a sweep step's latencies;
# sweep_figures: a sweep's latency-vs-throughput charts; sweep_load: its latency-vs-offered-
# load charts; turns: the multi-turn table; profile: the definition profiles' tokentrace row
View = Literal[
    "page",
    "figures",
    "live",
    "table",
    "compare",
    "sweep",
    "sweep_figures",
    "sweep_load",
    "turns",
    "profile",
]
Stream = Literal["stream", "no-stream"]
BOTH_STREAM_MODES: frozenset[Stream] = frozenset(("stream", "no-stream"))


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """The metric in the definition profiles (``app.analysis.profiles``): its key there,
    which every profile shares (vLLM's, GuideLLM's and AIPerf's "ttft" sit beside ours),
    its label and our definition in words."""

    key: str
    label: str
    definition: str


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # the report's key: "ttft_ms"
    label: str  # short, for tables and axes: "TTFT"
    title: str  # long, for page rows and figure titles: "Time to first token"
    unit: str  # "ms", "tok/s", "req/s"
    decimals: int  # digits after the point wherever the value is shown
    aggregation: Aggregation  # what one sample is
    better: Literal["lower", "higher"] = "lower"
    short: str = ""  # the shortest name (tabs, the live table): "E2E"; default the label
    # how it is computed: exactly the one its aggregation needs (module docstring)
    per_request: Callable[[RunBasis], F64 | None] | None = None
    pooled: Callable[[RunBasis], Distribution] | None = None
    samples: Callable[[RunBasis], F64] | None = None
    per_run: Callable[[RunTotals], float | None] | None = None
    per_unit: float = NS_PER_MS  # a per-request value's base units per shown unit
    requires: str = ""  # what a run must have recorded for it ("connection phases")
    no_data: str = "no samples"  # why a run has none when ``per_request`` gives None
    empty: str = "no successful request"  # why a figure of its samples may have none
    # the bootstrap seeds of its 95% intervals, fixed per metric (never by position, so a
    # new metric moves no other metric's interval): in a run's report (report seed +
    # ``seed``) and in a comparison (the comparison's seed + ``compare_seed``)
    seed: int = 0
    compare_seed: int | None = None
    # where a request's value is stored: the requests table's SQL column (sortable and
    # filterable), else ``requests.metric_values`` (per_request metrics read from events,
    # no migration); ``from_row``: derived from a stored request's other columns, not stored
    column: str | None = None
    from_row: Callable[[Mapping[str, object]], float | None] | None = None
    # goodput: the SLO name that bounds it ("ttft" in --goodput ttft:150)
    slo: str | None = None
    slo_undefined_passes: bool = False  # an undefined value meets its SLO (TPOT, n < 2)
    goodput_requires: bool = False  # a request without this value is never good (E2E)
    # defined on a run whose answers carry no generated tokens (embeddings, rerank:
    # ``app.analysis.answers``); the others read "not applicable" there
    answers: bool = False
    uses_slos: bool = False  # a per-run value that depends on the SLOs (goodput)
    # where it is shown
    views: frozenset[View] = frozenset()
    headline: tuple[str, ...] = ()  # statistics cached on the run row for listings
    gate: tuple[str, ...] = ()  # statistics a series gate checks unless told which
    profile: ProfileRow | None = None
    # the API surfaces (``RunSpec.endpoint``) and stream modes it applies to (None: every
    # surface); a view leaves out a metric that does not apply to the run
    surfaces: frozenset[str] | None = None
    streams: frozenset[Stream] = BOTH_STREAM_MODES

    def __post_init__(self) -> None:
        need = {
            "per_request": self.per_request,
            "per_token_pooled": self.pooled,
            "per_chunk_pooled": self.pooled,
            "per_run": self.per_run,
        }[self.aggregation]
        if need is None:
            raise ValueError(f"metric {self.key}: a {self.aggregation} metric needs its compute")
        if "compare" in self.views and self.per_run is None and self.compare_seed is None:
            raise ValueError(f"metric {self.key}: a compared latency needs its compare_seed")
        if ("table" in self.views or "live" in self.views) and self.column is None:
            raise ValueError(f"metric {self.key}: the table and live views read its column")
        if "profile" in self.views and self.profile is None:
            raise ValueError(f"metric {self.key}: the profile view needs its ProfileRow")
        if self.column is not None and self.aggregation != "per_request":
            raise ValueError(f"metric {self.key}: only a per-request value has a column")

    @property
    def heading(self) -> str:
        """``TTFT (ms)``: the label with its unit."""
        return f"{self.label} ({self.unit})"

    @property
    def per(self) -> str:
        """What one sample is, in a word: request, token, chunk, run."""
        return AGG_SHORT[self.aggregation]

    @property
    def name(self) -> str:
        """The shortest name: ``short``, else the label."""
        return self.short or self.label

    @property
    def short_key(self) -> str:
        """The key without its unit, as a user types it: "ttft", "output_throughput"."""
        return self.key.removesuffix("_" + self.unit.replace("/", "_"))

    @property
    def column_name(self) -> str:
        """The name a view gives its column (sort, filter, live): "ttft" for ``ttft_ns``."""
        if self.column is None:
            raise ValueError(f"metric {self.key} has no column")
        return self.column.removesuffix("_ns")

    @property
    def stored(self) -> bool:
        """Whether a request's value is stored (a column or ``metric_values``)."""
        return self.aggregation == "per_request" and self.from_row is None

    def applies(self, endpoint: str | None = None, stream: bool | None = None) -> bool:
        """Whether it applies to a run on ``endpoint`` (``RunSpec.endpoint``) streamed or
        not (None: not known, e.g. an import: it applies)."""
        if endpoint is not None and self.surfaces is not None and endpoint not in self.surfaces:
            return False
        return stream is None or ("stream" if stream else "no-stream") in self.streams


@dataclass(frozen=True, slots=True)
class RunTotals:
    """What a one-number-per-run metric is computed from."""

    window: Window | None
    ok: int  # successful requests
    input_tokens: int  # of the successful requests (unknown counts left out)
    output_tokens: int
    good: int | None  # requests meeting every SLO in force; None without SLOs
    items: int | None = None  # the items the answers carried (embeddings, rerank), else None


class RunBasis:
    """What a metric is computed from: one run's columnar trace and the per-request arrays
    derived from its events, each built the first time a metric asks (a run of 10M events
    builds its token view once). ``metrics``: the registry, by key (``value`` of another
    metric: user-perceived TTFT reads TTFT). Pooled samples are consumed by their
    distribution (sorted in place)."""

    def __init__(
        self, trace: RunTrace, metrics: Mapping[str, Metric], *, ci: bool = True, seed: int = 0
    ) -> None:
        self.trace = trace
        self.metrics = metrics
        self.ci = ci
        self.seed = seed
        self._values: dict[str, F64 | None] = {}
        self._dists: dict[str, Distribution] = {}

    @cached_property
    def tokens(self) -> EventView:
        """The token-bearing events (content or reasoning, > 0 tokens)."""
        return event_view(self.trace)

    @cached_property
    def content(self) -> EventView:
        """The token-bearing content (non-reasoning) events."""
        return content_view(self.trace, self.tokens)

    @cached_property
    def valid(self) -> BoolArr:
        """Requests that can be latency samples: ok and sent."""
        return valid_requests(self.trace)

    @cached_property
    def t_first(self) -> I64:
        return self.tokens.first_t()

    @cached_property
    def t_last(self) -> I64:
        """The last token-bearing event per request; where it has none, its whole answer's
        arrival (a surface that generates no tokens), else -1."""
        t = self.tokens.last_t()
        if has_answers(self.trace):
            t = np.where(t >= 0, t, answer_end_times(self.trace))
        return t

    @cached_property
    def n_tokens(self) -> I64:
        """Output tokens per request: the recorded count, else the token events' sum."""
        return output_token_counts(self.trace, self.tokens)

    @cached_property
    def itl(self) -> ItlSamples:
        """The pooled ITL samples (ns) of the token-bearing events."""
        return itl_samples(self.trace, self.tokens)

    def forget_samples(self) -> None:
        """Drop the pooled ITL samples (a run of 10M events holds two arrays of them) once
        their distributions are computed."""
        self.__dict__.pop("itl", None)

    def since_sent(self, t_ns: I64) -> F64:
        """``t - sent`` per request in ns, NaN where not valid or ``t`` unknown (-1)."""
        return since_sent(t_ns, self.trace, self.valid)

    def value(self, key: str) -> F64 | None:
        """A per-request metric's values (its ``per_request``), computed once."""
        if key not in self._values:
            compute = self.metrics[key].per_request
            if compute is None:
                raise ValueError(f"metric {key} has no per-request values")
            self._values[key] = compute(self)
        return self._values[key]

    def distribution(self, key: str) -> Distribution:
        """A latency's distribution in its unit (its report entry), computed once."""
        if key not in self._dists:
            m = self.metrics[key]
            if m.pooled is not None:
                self._dists[key] = m.pooled(self)
            else:
                values = self.value(key)
                self._dists[key] = (
                    Distribution.no_data(m.no_data)
                    if values is None
                    else summarize(values, ci=self.ci, seed=self.seed + m.seed).divided(m.per_unit)
                )
        return self._dists[key]
