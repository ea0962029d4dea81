"""A series of runs, pure: its name rule, the metrics a trend follows, each run's compact
point (a value and its 95% bootstrap interval per metric and statistic, from the run's
report), the trend of one metric, its change points described, threshold checks and the
gate (a run against its series).

**Point.** ``point_of(report_metrics)``: for each latency of ``metric_defs.latencies()``
its mean and percentiles with the run's own 95% interval (``percentiles.summarize``:
bootstrap, or the order-statistic interval past ``BOOTSTRAP_MAX_N`` samples), for each
rate of ``rates()`` its value (one number per run: no interval), and the error rate.

**Trend.** The values of one metric/statistic over the series' runs in order. Change
points (``change_points.e_divisive``) are found on the runs that count: members whose
key matches the series (not *flagged*) and that can be trusted (``trust``); each is
described by the medians of the segments on either side, its size and direction
(a regression when the metric moved the wrong way: ``Metric.better``), the runs on either
side, and the comparability fields that differ between them.

**Gate.** A run judged against the trusted runs of its segment before it (the runs since
the last change point, at most ``GATE_WINDOW``): *regressed* when the run is worse than
their median by at least the threshold and its own interval lies wholly beyond that median
(the rule ``app.analysis.compare`` applies to a difference's interval), *improved* the
other way; and regressed whenever one of the series' threshold alerts is broken.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from app.analysis import change_points as cp
from app.analysis.comparability import KEY_FIELDS, allowed_to_differ, check
from app.analysis.metric_defs import METRICS, TTFT, latencies, metric, rates
from app.analysis.percentiles import PERCENTILES, percentile_key

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")
NAME_RULE = "1 to 100 characters from A-Z a-z 0-9 . _ -"
LATENCY_STATS: tuple[str, ...] = ("mean", *(percentile_key(p) for p in PERCENTILES))
RATE_STAT = "value"
ERROR_RATE = "error_rate"
GATE_WINDOW = 10  # runs before the gated one it is judged against, at most
MemberState = Literal["pending", "member", "flagged", "refused"]
Verdict = Literal["regressed", "improved", "no significant change", "no data"]


def short_names() -> dict[str, str]:
    """The names a user types (``ttft:p99``, ``output_throughput``: ``Metric.short_key``)
    -> report keys."""
    return {m.short_key: m.key for m in METRICS.values()}


def check_name(name: str) -> str:
    """``name`` when it is a valid series name, else a ValueError saying the rule."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise ValueError(f"series name {str(name)[:120]!r} is not valid: use {NAME_RULE}")
    return name


@dataclass(frozen=True, slots=True)
class MetricRef:
    """One trend: a metric of ``metric_defs`` (or the error rate) and its statistic."""

    key: str  # "ttft_ms", "output_throughput_tok_s", "error_rate"
    stat: str  # "p99", "mean", ... ; "value" for a rate or the error rate

    @property
    def text(self) -> str:
        short = metric(self.key).short_key if self.key in METRICS else self.key
        return short if self.stat == RATE_STAT else f"{short}:{self.stat}"

    @property
    def label(self) -> str:
        if self.key == ERROR_RATE:
            return "error rate"
        m = metric(self.key)
        return m.label if self.stat == RATE_STAT else f"{m.label} {self.stat}"

    @property
    def unit(self) -> str:
        return "" if self.key == ERROR_RATE else metric(self.key).unit

    @property
    def better(self) -> Literal["lower", "higher"]:
        return "lower" if self.key == ERROR_RATE else metric(self.key).better


DEFAULT_REF = MetricRef(TTFT.key, "p99")
DEFAULT_REF_CELL = (DEFAULT_REF.key, DEFAULT_REF.stat)


def parse_metric(text: str) -> MetricRef:
    """``ttft:p99``, ``e2el:mean``, ``output_throughput``, ``error_rate`` (a metric's
    ``short_key`` or its key, and a statistic) -> a ``MetricRef``; ValueError naming what is
    wrong."""
    raw = str(text).strip()
    name, _, stat = raw.partition(":")
    names = short_names()
    key = names.get(name, name)
    if key == ERROR_RATE:
        if stat not in ("", RATE_STAT):
            raise ValueError("metric error_rate has no statistic: write error_rate")
        return MetricRef(ERROR_RATE, RATE_STAT)
    if key not in METRICS:
        known = ", ".join([*names, ERROR_RATE])
        raise ValueError(f"metric {name[:60]!r} is not known: choose from {known}")
    m = METRICS[key]
    if m.aggregation == "per_run":
        if stat not in ("", RATE_STAT):
            raise ValueError(f"metric {name} is one number per run: write {name} alone")
        return MetricRef(key, RATE_STAT)
    stat = stat or "p99"
    if stat not in LATENCY_STATS:
        raise ValueError(
            f"statistic {stat[:30]!r} of {name} is not known: choose from "
            + ", ".join(LATENCY_STATS)
        )
    return MetricRef(key, stat)


def gate_defaults() -> list[str]:
    """The trends a gate checks unless told which (each metric's ``gate`` statistics), as
    a user writes them: ``ttft:p99``, ``output_throughput``."""
    return [
        m.short_key if stat == RATE_STAT else f"{m.short_key}:{stat}"
        for m in METRICS.values()
        for stat in m.gate
    ]


def refs() -> list[MetricRef]:
    """Every trend a series offers, in the pages' order."""
    out = [MetricRef(m.key, s) for m in latencies() for s in LATENCY_STATS]
    out += [MetricRef(m.key, RATE_STAT) for m in rates()]
    return [*out, MetricRef(ERROR_RATE, RATE_STAT)]


# -------------------------------------------------------------------------------- points

Cell = list[float | None]  # [value, interval low, interval high]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def point_of(metrics: Mapping[str, Any]) -> dict[str, dict[str, Cell]]:
    """The compact point of one run from its report's ``metrics``: metric -> statistic ->
    [value, low, high] (None where there is no data or no interval)."""
    out: dict[str, dict[str, Cell]] = {}
    for m in latencies():
        d = metrics.get(m.key)
        if not isinstance(d, Mapping):
            continue
        ci = d.get("ci95") if isinstance(d.get("ci95"), Mapping) else {}
        cells: dict[str, Cell] = {}
        for stat in LATENCY_STATS:
            bounds = ci.get(stat) if isinstance(ci, Mapping) else None
            lo = hi = None
            if isinstance(bounds, list | tuple) and len(bounds) == 2:
                lo, hi = _num(bounds[0]), _num(bounds[1])
            cells[stat] = [_num(d.get(stat)), lo, hi]
        out[m.key] = cells
    for m in rates():
        out[m.key] = {RATE_STAT: [_num(metrics.get(m.key)), None, None]}
    out[ERROR_RATE] = {RATE_STAT: [_num(metrics.get(ERROR_RATE)), None, None]}
    return out


def cell(point: Mapping[str, Any] | None, ref: MetricRef) -> tuple[float | None, ...]:
    """(value, low, high) of ``ref`` in a stored point; Nones where it has none."""
    got = ((point or {}).get(ref.key) or {}).get(ref.stat)
    if not isinstance(got, list | tuple) or len(got) != 3:
        return (None, None, None)
    return tuple(_num(v) for v in got)


# --------------------------------------------------------------------------------- trend


@dataclass(frozen=True, slots=True)
class Member:
    """A run of a series as the trend reads it (``state``: member or flagged)."""

    run_id: str
    label: str  # its name, or its id
    created_at: str
    state: str
    reason: str | None
    trusted: bool
    issues: tuple[str, ...]
    key: Mapping[str, Any] | None
    point: Mapping[str, Any] | None
    track: str = ""  # a sweep step's load ("" for a plain run)
    sweep_id: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """A change point of a trend, described."""

    index: int  # into the trend's runs: the first run after the change
    run_before: str
    run_after: str
    before: float  # median of the segment before
    after: float  # median of the segment after
    delta: float
    relative: float | None
    direction: Literal["up", "down"]
    kind: Literal["regression", "improvement"]
    p_value: float
    q: float
    fields: list[dict[str, Any]]  # comparability fields that differ between the two runs

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "run_before": self.run_before,
            "run_after": self.run_after,
            "before": self.before,
            "after": self.after,
            "delta": self.delta,
            "relative": self.relative,
            "direction": self.direction,
            "kind": self.kind,
            "p_value": self.p_value,
            "q": self.q,
            "changed_fields": list(self.fields),
        }


@dataclass(frozen=True, slots=True)
class Trend:
    ref: MetricRef
    track: str
    runs: list[Member]  # in series order (every member and flagged run of the track)
    values: list[float | None]
    lows: list[float | None]
    highs: list[float | None]
    counted: list[bool]  # used for change points: matching key, trusted, a value
    changes: list[Change] = field(default_factory=list)
    method: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.ref.key,
            "stat": self.ref.stat,
            "label": self.ref.label,
            "unit": self.ref.unit,
            "better": self.ref.better,
            "track": self.track,
            "method": self.method,
            "points": [
                {
                    "run_id": m.run_id,
                    "label": m.label,
                    "created_at": m.created_at,
                    "state": m.state,
                    "reason": m.reason,
                    "trusted": m.trusted,
                    "trust_issues": list(m.issues),
                    "sweep_id": m.sweep_id,
                    "value": v,
                    "ci_low": lo,
                    "ci_high": hi,
                    "counted": c,
                }
                for m, v, lo, hi, c in zip(
                    self.runs, self.values, self.lows, self.highs, self.counted, strict=True
                )
            ],
            "change_points": [c.to_dict() for c in self.changes],
        }


METHOD = (
    "E-Divisive means (Matteson & James 2014; as in Daly et al., ICPE 2020): permutation "
    "test, {perms} shuffles, p <= {p:g}, at least {size} runs each side, seed {seed}; on "
    "the trusted runs whose key matches the series"
)


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, np.float64)))


def key_changes(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The comparability fields that differ between two runs' keys."""
    if not a or not b:
        return []
    return [d.to_dict() for d in check([a, b]).differing]


def describe(
    ref: MetricRef, runs: Sequence[Member], values: Sequence[float], found: Sequence[cp.ChangePoint]
) -> list[Change]:
    """Each change point (indexes into ``values``/``runs``, the counted runs) described."""
    cuts = [0, *[c.index for c in found], len(values)]
    out: list[Change] = []
    for i, c in enumerate(found):
        before = _median(values[cuts[i] : cuts[i + 1]])
        after = _median(values[cuts[i + 1] : cuts[i + 2]])
        delta = after - before
        worse = delta > 0 if ref.better == "lower" else delta < 0
        out.append(
            Change(
                index=c.index,
                run_before=runs[c.index - 1].run_id,
                run_after=runs[c.index].run_id,
                before=before,
                after=after,
                delta=delta,
                relative=delta / before if before else None,
                direction="up" if delta > 0 else "down",
                kind="regression" if worse else "improvement",
                p_value=c.p_value,
                q=c.q,
                fields=key_changes(runs[c.index - 1].key, runs[c.index].key),
            )
        )
    return out


def trend(
    members: Sequence[Member],
    ref: MetricRef,
    *,
    track: str = "",
    pvalue: float = cp.DEFAULT_PVALUE,
    permutations: int = cp.DEFAULT_PERMUTATIONS,
    min_size: int = cp.DEFAULT_MIN_SIZE,
    seed: int = cp.DEFAULT_SEED,
) -> Trend:
    """The trend of ``ref`` over ``members`` (in series order) of one track, with its
    change points found on the counted runs (their indexes mapped back to ``runs``)."""
    runs = [m for m in members if m.state in ("member", "flagged") and m.track == track]
    cells = [cell(m.point, ref) for m in runs]
    values = [c[0] for c in cells]
    counted = [
        m.state == "member" and m.trusted and v is not None
        for m, v in zip(runs, values, strict=True)
    ]
    idx = [i for i, c in enumerate(counted) if c]
    sub_values = [float(values[i]) for i in idx]  # type: ignore[arg-type]
    found = cp.e_divisive(
        sub_values, pvalue=pvalue, permutations=permutations, min_size=min_size, seed=seed
    )
    changes = describe(ref, [runs[i] for i in idx], sub_values, found)
    mapped = [dataclasses.replace(c, index=idx[c.index]) for c in changes]  # into ``runs``
    method = METHOD.format(perms=permutations, p=pvalue, size=min_size, seed=seed)
    return Trend(
        ref, track, runs, values, [c[1] for c in cells], [c[2] for c in cells], counted,
        mapped, method,
    )  # fmt: skip


def tracks(members: Sequence[Member]) -> list[str]:
    """The tracks of a series in first-seen order ("" first: plain runs)."""
    return list(dict.fromkeys(m.track for m in members if m.state in ("member", "flagged")))


# ---------------------------------------------------------------------------- key checks


def key_mismatch(
    series_key: Mapping[str, Any] | None, run_key: Mapping[str, Any], vary: Sequence[str]
) -> list[dict[str, Any]]:
    """The fields where ``run_key`` differs from the series' key, other than those the
    series lets vary (empty: it matches, or the series has no key yet). As in a comparison
    (``allowed_to_differ``), the target may differ with a server field the series lets vary
    when that field does differ: a new engine version is often another deployment."""
    if series_key is None:
        return []
    differing = check([series_key, run_key]).differing
    changed = {d.field for d in differing}
    allowed = set(vary)
    for varied in allowed & changed:
        allowed |= allowed_to_differ(varied)
    return [d.to_dict() for d in differing if d.field not in allowed]


def mismatch_reason(diffs: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for d in diffs:
        vals = d.get("values") or [None, None]
        parts.append(f"{d.get('label')}: series {vals[0]!r}, run {vals[-1]!r}")
    return "its comparability key differs from the series': " + "; ".join(parts)


def check_vary(fields: Sequence[str]) -> list[str]:
    """The key fields a series lets vary, checked (ValueError names an unknown one)."""
    out = []
    for f in fields:
        if f not in KEY_FIELDS:
            raise ValueError(f"{f!r} is not a comparability field; choose from {list(KEY_FIELDS)}")
        out.append(f)
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------ thresholds, gate


def worse_than(value: float, limit: float, better: str) -> bool:
    """Whether ``value`` is on the wrong side of ``limit``."""
    return value > limit if better == "lower" else value < limit


def threshold_breaches(
    value: float | None,
    *,
    better: str,
    absolute: float | None,
    relative: float | None,
    baseline: float | None,
) -> list[str]:
    """Why ``value`` breaks a threshold: past the absolute limit, or worse than the
    series' baseline value by more than ``relative`` (a fraction)."""
    if value is None:
        return []
    out = []
    if absolute is not None and worse_than(value, absolute, better):
        out.append(f"{value:g} is past the limit {absolute:g}")
    if relative is not None and baseline is not None and baseline != 0:
        rel = (value - baseline) / abs(baseline)
        if (rel > relative) if better == "lower" else (rel < -relative):
            out.append(
                f"{value:g} is {rel * 100:+.1f}% from the series' baseline {baseline:g} "
                f"(threshold {relative * 100:g}%)"
            )
    return out


@dataclass(frozen=True, slots=True)
class GateResult:
    ref: MetricRef
    verdict: Verdict
    value: float | None
    ci_low: float | None
    ci_high: float | None
    reference: float | None  # median of the runs judged against
    reference_runs: list[str]
    relative: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.ref.key,
            "stat": self.ref.stat,
            "label": self.ref.label,
            "verdict": self.verdict,
            "value": self.value,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "reference": self.reference,
            "reference_runs": list(self.reference_runs),
            "relative": self.relative,
            "reason": self.reason,
        }


def baseline_value(t: Trend, baseline_run: str | None) -> float | None:
    """The series' baseline value on this trend: its baseline run's, when it has one here,
    else its first counted run's."""
    for i, m in enumerate(t.runs):
        if m.run_id == baseline_run and t.values[i] is not None:
            return t.values[i]
    return next((t.values[i] for i, c in enumerate(t.counted) if c), None)


def history_before(t: Trend, index: int) -> list[tuple[str, float]]:
    """(run id, value) of the counted runs before ``t.runs[index]`` in its segment: since
    the last change point before it (a change point at the run itself starts the run's new
    segment, so the run is judged against the segment it left), at most ``GATE_WINDOW``,
    oldest first."""
    start = max([c.index for c in t.changes if c.index < index] or [0])
    out = [
        (t.runs[i].run_id, float(v))
        for i, v in enumerate(t.values[start:index], start)
        if t.counted[i] and v is not None
    ]
    return out[-GATE_WINDOW:]


def gate(
    ref: MetricRef,
    value: tuple[float | None, ...],
    history: Sequence[tuple[str, float]],
    *,
    threshold: float,
    breaches: Sequence[str] = (),
) -> GateResult:
    """The gate's verdict for one metric (the module doc's rule). ``value``: (value, low,
    high) of the gated run; ``history``: (run id, value) of the runs it is judged against,
    oldest first; ``threshold``: a fraction; ``breaches``: broken threshold alerts."""
    v, lo, hi = [*value, None, None, None][:3]
    ids = [h[0] for h in history]
    if v is None:
        return GateResult(ref, "no data", v, lo, hi, None, ids, None, "the run has no value")
    ref_value = _median([h[1] for h in history]) if history else None
    rel = (v - ref_value) / abs(ref_value) if ref_value else None
    if breaches:
        return GateResult(ref, "regressed", v, lo, hi, ref_value, ids, rel, "; ".join(breaches))
    if ref_value is None or rel is None:
        why = "no earlier trusted run to judge against"
        return GateResult(ref, "no data", v, lo, hi, ref_value, ids, rel, why)
    low = lo if lo is not None else v  # no interval (a rate): the value itself
    high = hi if hi is not None else v
    lower_better = ref.better == "lower"
    worse = (
        (rel >= threshold and low > ref_value)
        if lower_better
        else (rel <= -threshold and high < ref_value)
    )
    better = (
        (rel <= -threshold and high < ref_value)
        if lower_better
        else (rel >= threshold and low > ref_value)
    )
    shown = f"{rel * 100:+.1f}% vs the median {ref_value:g} of {len(ids)} earlier run(s)"
    if worse:
        return GateResult(ref, "regressed", v, lo, hi, ref_value, ids, rel, shown)
    if better:
        return GateResult(ref, "improved", v, lo, hi, ref_value, ids, rel, shown)
    return GateResult(ref, "no significant change", v, lo, hi, ref_value, ids, rel, shown)
