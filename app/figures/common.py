"""Plotly figure builders: plain arrays in, a Plotly figure dict (``{"data", "layout"}``) out.

Pure functions, testable without a browser. Where a plot would carry more points than a
screen can show, the builder keeps a subset (``MAX_POINTS``) and says so on the plot with an
annotation ``downsampled: N of M points``. Percentiles and metrics never come from here:
these functions only arrange samples for display.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.percentiles import percentiles

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Figure = dict[str, Any]

MAX_POINTS = 2000  # scatter / line points per trace
MAX_BARS = 1000  # request bars in the timeline
HIST_BINS = 60
TIME_BINS = 200  # throughput / in-flight time bins
BLOCK = 1 << 20  # samples per block where a builder walks 10M of them

STATUS_COLORS = {
    "ok": "#2e7d32",
    "error": "#c62828",
    "timeout": "#ef6c00",
    "cancelled": "#6d6d6d",
}
KIND_NAMES = {0: "content", 1: "reasoning", 2: "role", 3: "usage", 4: "other"}
KIND_COLORS = {0: "#1565c0", 1: "#8e24aa", 2: "#9e9e9e", 3: "#00897b", 4: "#bdbdbd"}


# --------------------------------------------------------------------------- helpers


def values(arr: npt.ArrayLike, ndigits: int = 3) -> list[float | None]:
    """A JSON-safe list: rounded floats, NaN/inf as ``None`` (Plotly draws a gap)."""
    a = np.asarray(arr, np.float64)
    if a.size == 0:
        return []
    out: list[float | None] = np.round(a, ndigits).tolist()
    bad = ~np.isfinite(a)
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            out[i] = None
    return out


def evenly(n: int, k: int) -> I64:
    """``k`` evenly spaced indices into ``range(n)``, first and last included (all if n <= k)."""
    if n <= k:
        return np.arange(n, dtype=np.int64)
    out: I64 = np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))
    return out


def minmax_keep(y: npt.ArrayLike, max_points: int) -> I64:
    """Indices that keep a series' shape: ``y`` (in display order, e.g. by time) cut into
    ``max_points // 2`` consecutive buckets, and from each bucket the index of its minimum
    and of its maximum, so spikes and dips survive (a flat bucket gives two of its points);
    all indices if ``len(y) <= max_points``; the first and last are always kept. NaN values
    are never chosen over a number."""
    a = np.asarray(y, np.float64)
    n = int(a.shape[0])
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    nb = max(1, (max_points - 2) // 2)  # two a bucket, plus the first and last
    bounds = np.linspace(0, n, nb + 1).round().astype(np.int64)
    keep: list[int] = [0, n - 1]
    finite = np.isfinite(a)
    if bool(finite.all()):  # no NaN to step over: no two copies of a 10M-point series
        low = high = a
    else:
        low = np.where(finite, a, np.inf)
        high = np.where(finite, a, -np.inf)
    del finite
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if hi <= lo:
            continue
        a, b = lo + int(np.argmin(low[lo:hi])), lo + int(np.argmax(high[lo:hi]))
        keep += [a, b] if a != b else [a, (lo + hi - 1) // 2 if a == lo else lo]
    out: I64 = np.unique(np.asarray(keep, np.int64))
    return out


def int_axis(top: float, *, ticks: int = 5) -> dict[str, Any]:
    """Axis settings for a count (requests, samples): whole-number ticks only."""
    step = max(1.0, float(top) / ticks)
    mag = 10.0 ** math.floor(math.log10(step))
    nice = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= step)
    return {"tickformat": ",d", "tick0": 0, "dtick": max(1, int(nice)), "rangemode": "tozero"}


def downsample_note(shown: int, total: int) -> dict[str, Any]:
    return _note(f"downsampled: {shown:,} of {total:,} points", y=1.0, yanchor="bottom")


def _note(text: str, *, y: float = 0.5, yanchor: str = "middle") -> dict[str, Any]:
    return {
        "text": text,
        "xref": "paper",
        "yref": "paper",
        "x": 1.0,
        "y": y,
        "xanchor": "right",
        "yanchor": yanchor,
        "showarrow": False,
        "font": {"size": 11, "color": "#555"},
    }


def _layout(title: str, xtitle: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 14}},
        "xaxis": {"title": {"text": xtitle}, "zeroline": False},
        "yaxis": {"title": {"text": ytitle}, "zeroline": False},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
        "height": 320,
        "showlegend": False,
        "annotations": [],
    }
    layout.update(extra)
    return layout


def empty_figure(title: str, reason: str) -> Figure:
    """A figure with no traces and the reason written in the middle."""
    layout = _layout(title, "", "")
    layout["xaxis"]["visible"] = False
    layout["yaxis"]["visible"] = False
    layout["annotations"] = [
        {**_note(f"no data: {reason}"), "x": 0.5, "xanchor": "center", "font": {"size": 13}}
    ]
    return {"data": [], "layout": layout}


def shade_window(fig: Figure, start_s: float, end_s: float, label: str) -> Figure:
    """``fig`` (a time chart, x in run-relative s) with ``[start_s, end_s]`` shaded behind
    its traces and named at its top (a rectangle shape: the steady window)."""
    if not fig.get("data"):
        return fig  # an empty figure has no time axis
    layout = fig["layout"]
    layout.setdefault("shapes", []).append(
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": round(start_s, 6),
            "x1": round(end_s, 6),
            "y0": 0,
            "y1": 1,
            "fillcolor": "#43a047",
            "opacity": 0.12,
            "line": {"width": 0},
            "layer": "below",
            "name": label,
        }
    )
    layout.setdefault("annotations", []).append(
        {
            **_note(label, y=1.0, yanchor="bottom"),
            "x": round(start_s, 6),
            "xref": "x",
            "xanchor": "left",
        }
    )
    return fig


def point_count(fig: Figure) -> int:
    """Total number of x values over a figure's traces (gaps included)."""
    return sum(len(t.get("x") or []) for t in fig["data"])


def _finite(arr: npt.ArrayLike) -> F64:
    a = np.asarray(arr, np.float64)
    out: F64 = a[np.isfinite(a)]
    return out


# --------------------------------------------------------------------------- distributions


def cdf_figure(
    samples: npt.ArrayLike,
    *,
    title: str,
    unit: str = "ms",
    xtitle: str | None = None,
    max_points: int = MAX_POINTS,
    no_data_reason: str = "no samples",
) -> Figure:
    """Empirical CDF of the finite ``samples`` (x sorted, y = rank / N)."""
    return _cdf(np.sort(_finite(samples)), title, unit, xtitle, max_points, no_data_reason)


def _cdf(
    x: F64, title: str, unit: str, xtitle: str | None, max_points: int, no_data_reason: str
) -> Figure:
    """``cdf_figure`` of samples already finite and sorted."""
    n = int(x.shape[0])
    if n == 0:
        return empty_figure(title, no_data_reason)
    keep = evenly(n, max_points)
    y = (keep + 1) / n
    trace = {
        "type": "scatter",
        "mode": "lines",
        "x": values(x[keep]),
        "y": values(y, 5),
        "line": {"shape": "hv", "color": "#1565c0"},
        "hovertemplate": f"%{{x}} {unit}<br>%{{y:.2%}}<extra></extra>",
    }
    layout = _layout(title, xtitle or f"value ({unit})", "fraction of samples (0–1)")
    layout["yaxis"]["range"] = [0, 1.02]
    if keep.shape[0] < n:
        layout["annotations"].append(downsample_note(int(keep.shape[0]), n))
    return {"data": [trace], "layout": layout}


def distribution_figures(
    samples: F64,
    *,
    title: str,
    unit: str = "ms",
    xtitle: str | None = None,
    no_data_reason: str = "no samples",
) -> tuple[Figure, Figure]:
    """(``cdf_figure``, ``histogram_figure``) of the same samples, titled ``title: CDF`` and
    ``title: histogram``, equal to calling both. ``samples`` is consumed: sorted and then
    partitioned in place, so 10M samples cost no copy beyond the non-finite ones' removal."""
    x = samples if samples.dtype == np.float64 and samples.flags.writeable else _finite(samples)
    finite = np.isfinite(x)
    if not bool(finite.all()):
        x = x[finite]
    del finite
    x.sort()
    cdf = _cdf(x, f"{title}: CDF", unit, xtitle, MAX_POINTS, no_data_reason)
    hist = _histogram(x, f"{title}: histogram", unit, xtitle, None, no_data_reason, True)
    return cdf, hist


TAIL_Q = (0.5, 99.5)  # histogram range: these percentiles; the rest in under/overflow bars


def histogram_bins(
    x: F64, bins: int | None = None, *, overwrite_input: bool = False
) -> tuple[F64, int, int]:
    """Bin edges for a readable histogram of ``x`` (finite, non-empty): from the p0.5 to the
    p99.5 of the data (so one slow outlier does not squash the body into a bar or two), the
    bin count from the Freedman–Diaconis width (10 to ``HIST_BINS``) unless ``bins`` is
    given. Returns (edges, values below the first edge, values above the last).
    ``overwrite_input``: the percentiles may reorder ``x`` (no copy of it)."""
    lo, hi = (float(v) for v in np.percentile(x, TAIL_Q, overwrite_input=overwrite_input))
    if hi <= lo:  # (nearly) constant data: one narrow range around it
        lo, hi = float(x.min()), float(x.max())
        if hi <= lo:
            hi = lo + max(abs(lo) * 1e-3, 1e-3)
    if bins is None:
        q25, q75 = np.percentile(x, (25.0, 75.0), overwrite_input=overwrite_input)
        width = 2.0 * float(q75 - q25) / max(x.shape[0], 1) ** (1.0 / 3.0)
        fd_bins = math.ceil((hi - lo) / width) if width > 0 else HIST_BINS
        bins = int(np.clip(fd_bins, 10, HIST_BINS))
    edges: F64 = np.linspace(lo, hi, bins + 1)
    under = int(np.count_nonzero(x < lo))
    over = int(np.count_nonzero(x > hi))
    return edges, under, over


def histogram_figure(
    samples: npt.ArrayLike,
    *,
    title: str,
    unit: str = "ms",
    xtitle: str | None = None,
    bins: int | None = None,
    no_data_reason: str = "no samples",
) -> Figure:
    """Histogram of the finite ``samples``, binned here (``histogram_bins``): the body in
    even bins, values beyond p0.5 / p99.5 in one underflow and one overflow bar (grey,
    labelled with their range) so no sample is dropped and no spike hides the body."""
    return _histogram(_finite(samples), title, unit, xtitle, bins, no_data_reason, False)


def _histogram(
    x: F64,
    title: str,
    unit: str,
    xtitle: str | None,
    bins: int | None,
    no_data_reason: str,
    overwrite_input: bool,
) -> Figure:
    """``histogram_figure`` of finite samples (reordered when ``overwrite_input``)."""
    n = int(x.shape[0])
    if n == 0:
        return empty_figure(title, no_data_reason)
    edges, under, over = histogram_bins(x, bins, overwrite_input=overwrite_input)
    counts, _ = np.histogram(x, bins=edges)  # values beyond the edges are not counted
    width = float(edges[1] - edges[0])
    centers = (edges[:-1] + edges[1:]) / 2
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": "samples",
            "x": values(centers, 4),
            "y": counts.astype(np.int64).tolist(),
            "width": width,
            "marker": {"color": "#1565c0"},
            "hovertemplate": f"%{{x}} {unit}: %{{y}}<extra></extra>",
        }
    ]
    tails_x: list[float | None] = []
    tails_y: list[int] = []
    tails_text: list[str] = []
    if under:
        tails_x += values([edges[0] - 1.5 * width], 4)
        tails_y.append(under)
        tails_text.append(f"< {edges[0]:.4g} {unit} (min {x.min():.4g})")
    if over:
        tails_x += values([edges[-1] + 1.5 * width], 4)
        tails_y.append(over)
        tails_text.append(f"> {edges[-1]:.4g} {unit} (max {x.max():.4g})")
    if tails_y:
        data.append(
            {
                "type": "bar",
                "name": "beyond p0.5–p99.5",
                "x": tails_x,
                "y": tails_y,
                "width": width,
                "text": tails_text,
                "marker": {"color": "#9e9e9e"},
                "hovertemplate": "%{text}: %{y}<extra></extra>",
            }
        )
    layout = _layout(title, xtitle or f"value ({unit})", "samples (count)")
    layout["bargap"] = 0.02
    top = max([int(counts.max()) if counts.size else 0, *tails_y, 1])
    layout["yaxis"].update(int_axis(top))
    text = f"{n:,} samples in {len(centers)} bins"
    if tails_y:
        text += f"; grey: {under + over:,} beyond p0.5–p99.5"
    layout["annotations"].append(_note(text, y=1.0, yanchor="bottom"))
    return {"data": data, "layout": layout}


# --------------------------------------------------------------------------- requests


def _segments(start: F64, stop: F64, rows: F64) -> tuple[list[float | None], list[float | None]]:
    """x/y lists of horizontal segments start->stop at height ``rows``, separated by gaps."""
    k = start.shape[0]
    xs = np.full((k, 3), np.nan)
    ys = np.full((k, 3), np.nan)
    xs[:, 0], xs[:, 1] = start, stop
    ys[:, 0], ys[:, 1] = rows, rows
    return values(xs.ravel()), values(ys.ravel(), 0)


def timeline_figure(
    sent_s: npt.ArrayLike,
    first_s: npt.ArrayLike,
    last_s: npt.ArrayLike,
    end_s: npt.ArrayLike,
    status: Sequence[str],
    index: npt.ArrayLike,
    *,
    max_bars: int = MAX_BARS,
) -> Figure:
    """One bar per request, ordered by send time: sent -> first token (thin, grey) and
    first token -> last token (thick, coloured by status). Failed requests without tokens
    run sent -> end. Times in s (run-relative); NaN where unknown. ``index`` (the request
    index) is attached for click-through."""
    sent = np.asarray(sent_s, np.float64)
    first = np.asarray(first_s, np.float64)
    last = np.asarray(last_s, np.float64)
    end = np.asarray(end_s, np.float64)
    idx = np.asarray(index, np.int64)
    st = np.asarray(list(status), dtype=object)
    was_sent = np.flatnonzero(np.isfinite(sent))
    total = int(was_sent.shape[0])
    title = "Request timeline"
    if total == 0:
        return empty_figure(title, "no request was sent")
    order = was_sent[np.argsort(sent[was_sent], kind="stable")]
    keep = order[evenly(total, max_bars)]
    rows = np.arange(keep.shape[0], dtype=np.float64)
    s, f, la, e = sent[keep], first[keep], last[keep], end[keep]
    stream_end = np.where(np.isfinite(la), la, e)
    stream_start = np.where(np.isfinite(f), f, s)
    wait_end = np.where(np.isfinite(f), f, s)
    data: list[dict[str, Any]] = []
    wx, wy = _segments(s, wait_end, rows)
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "waiting for first token",
            "x": wx,
            "y": wy,
            "line": {"color": "#b0bec5", "width": 1},
            "hoverinfo": "skip",
        }
    )
    statuses = st[keep]
    bar_px = float(np.clip(300.0 / max(keep.shape[0], 1), 1.0, 6.0))  # bars must not overlap
    for name in sorted(set(statuses.tolist())):
        m = statuses == name
        x, y = _segments(stream_start[m], stream_end[m], rows[m])
        custom = np.repeat(idx[keep][m], 3).tolist()
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": str(name),
                "x": x,
                "y": y,
                "customdata": custom,
                "line": {"color": STATUS_COLORS.get(str(name), "#333"), "width": bar_px},
                "hovertemplate": "request %{customdata}<br>%{x:.3f} s<extra>"
                + str(name)
                + "</extra>",
            }
        )
    layout = _layout(title, "time since run start (s)", "requests (one row each, by send time)")
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.2}
    layout["height"] = 380
    layout["yaxis"]["showticklabels"] = False
    if keep.shape[0] < total:
        note = downsample_note(int(keep.shape[0]), total)
        note["text"] = f"downsampled: {keep.shape[0]:,} of {total:,} requests"
        layout["annotations"].append(note)
    return {"data": data, "layout": layout}


def throughput_figure(
    token_t_s: npt.ArrayLike,
    token_counts: npt.ArrayLike,
    sent_s: npt.ArrayLike,
    end_s: npt.ArrayLike,
    *,
    bins: int = TIME_BINS,
    max_points: int = MAX_POINTS,
) -> Figure:
    """Output tokens/s per time bin (left axis) and requests in flight (right axis).

    ``token_t_s`` / ``token_counts``: arrival time (s) and token count of each token-bearing
    event of the successful requests; ``sent_s`` / ``end_s``: per request (NaN unknown)."""
    t = np.asarray(token_t_s, np.float64)
    k = np.asarray(token_counts)
    sent = np.asarray(sent_s, np.float64)
    end = np.asarray(end_s, np.float64)
    title = "Throughput and requests in flight"
    known = np.isfinite(sent)
    if not known.any():
        return empty_figure(title, "no request was sent")
    lo = float(sent[known].min())
    hi_parts = [float(sent[known].max())]
    if np.isfinite(end).any():
        hi_parts.append(float(np.nanmax(end)))
    if t.size:
        hi_parts.append(float(t.max()))
    hi = max(hi_parts)
    if hi <= lo:
        hi = lo + 1e-3
    data: list[dict[str, Any]] = []
    layout = _layout(title, "time since run start (s)", "output throughput (tok/s)")
    if t.size:
        counts, edges = _weighted_histogram(t, k, bins, (lo, hi))
        width = float(edges[1] - edges[0])
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "output tok/s",
                "x": values((edges[:-1] + edges[1:]) / 2, 4),
                "y": values(counts / width, 1),
                "line": {"shape": "hvh", "color": "#1565c0"},
                "hovertemplate": "%{x:.2f} s: %{y:.0f} tok/s<extra></extra>",
            }
        )
        layout["annotations"].append(
            _note(f"tokens/s in {bins} bins of {width:.3g} s", y=1.0, yanchor="bottom")
        )
    x, y, total = in_flight_steps(sent, end, hi, max_points)
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "in flight",
            "x": values(x, 4),
            "y": values(y, 0),
            "yaxis": "y2",
            "line": {"shape": "hv", "color": "#ef6c00"},
            "hovertemplate": "%{x:.2f} s: %{y} in flight<extra></extra>",
        }
    )
    if len(x) < total:
        layout["annotations"].append(
            {**downsample_note(len(x), total), "x": 0.0, "xanchor": "left"}
        )
    finite_y = y[np.isfinite(y)]
    layout["yaxis2"] = {
        "title": {"text": "requests in flight (count)"},
        "overlaying": "y",
        "side": "right",
        "showgrid": False,
        **int_axis(float(finite_y.max()) if finite_y.size else 1.0),
    }
    layout["yaxis"]["rangemode"] = "tozero"
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.2}
    layout["margin"]["r"] = 60
    return {"data": data, "layout": layout}


def _weighted_histogram(
    t: F64, weights: npt.NDArray[Any], bins: int, span: tuple[float, float]
) -> tuple[F64, F64]:
    """``np.histogram(t, bins, span, weights)``, the weights made float in blocks (no float
    copy of 10M token counts); the same sums for whole-number weights."""
    counts = np.zeros(bins, np.float64)
    edges: F64 = np.linspace(span[0], span[1], bins + 1)
    for a in range(0, t.shape[0], BLOCK):
        part, edges = np.histogram(
            t[a : a + BLOCK], bins=bins, range=span, weights=weights[a : a + BLOCK].astype(float)
        )
        counts += part
    return counts, edges


def in_flight_steps(
    sent: F64, end: F64, horizon: float, max_points: int = MAX_POINTS
) -> tuple[F64, F64, int]:
    """The step function "requests in flight" at every send/end: (x, y, exact point count).

    Requests without an end stay in flight until ``horizon``. Above ``max_points`` steps the
    function is reduced to the maximum of each of ``max_points // 2`` time bins (peaks kept).
    """
    s = sent[np.isfinite(sent)]
    e = np.where(np.isfinite(end), end, horizon)[np.isfinite(sent)]
    times = np.concatenate([s, e])
    delta = np.concatenate([np.ones(s.shape[0]), -np.ones(e.shape[0])])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before sends (+1)
    x = times[order]
    y = np.cumsum(delta[order])
    total = int(x.shape[0])
    if total <= max_points:
        return x, y, total
    nb = max(1, max_points // 2)
    lo, hi = float(x[0]), float(x[-1])
    edges = np.linspace(lo, hi, nb + 1)
    which = np.searchsorted(edges, x, side="right")
    which -= 1
    np.clip(which, 0, nb - 1, out=which)
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    peaks = np.maximum.reduceat(y, starts)
    return edges[which[starts]], peaks, total


def itl_position_figure(
    position: npt.ArrayLike,
    itl_ms: npt.ArrayLike,
    *,
    max_points: int = MAX_POINTS,
    no_data_reason: str = "no per-token data",
    position_bins: int = 100,
    sorted_by_position: bool = False,
) -> Figure:
    """ITL (per token, ms) against the token's position in its response: a sample of the
    points plus the median per position bin. ``sorted_by_position``: the points come
    sorted by position already, ties in event order (``itl_by_position``'s order)."""
    pos = np.asarray(position)
    if pos.dtype.kind != "i":
        pos = np.asarray(pos, np.float64)
    itl = np.asarray(itl_ms, np.float64)
    ok = np.isfinite(itl) if pos.dtype.kind == "i" else np.isfinite(pos) & np.isfinite(itl)
    if not bool(ok.all()):  # no copy of 10M points when every one is a number
        pos, itl = pos[ok], itl[ok]
    del ok
    n = int(pos.shape[0])
    title = "ITL against token position"
    if n == 0:
        return empty_figure(title, no_data_reason)
    if not sorted_by_position:
        order = np.argsort(pos, kind="stable")
        pos, itl = pos[order], itl[order]
        del order
    keep = minmax_keep(itl, max_points)  # by position: every bucket's slowest token stays
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "samples",
            "x": values(pos[keep], 0),
            "y": values(itl[keep]),
            "marker": {"size": 3, "color": "rgba(21,101,192,0.35)"},
            "hovertemplate": "token %{x}: %{y} ms<extra></extra>",
        }
    ]
    mx, my = _binned_median(pos, itl, position_bins)
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "median",
            "x": values(mx, 1),
            "y": values(my),
            "line": {"color": "#c62828", "width": 2},
            "hovertemplate": "token ≈%{x:.0f}: median %{y} ms<extra></extra>",
        }
    )
    layout = _layout(title, "token position in the response (tokens)", "ITL (ms)")
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.2}
    if keep.shape[0] < n:
        layout["annotations"].append(downsample_note(int(keep.shape[0]), n))
    return {"data": data, "layout": layout}


def _binned_median(x: npt.NDArray[Any], y: F64, bins: int) -> tuple[F64, F64]:
    """Median of ``y`` in each of up to ``bins`` equal-width bins of ``x`` (sorted; the
    non-empty bins). A value's bin: the last edge at or below it (the last bin also takes
    its upper edge)."""
    lo, hi = float(x[0]), float(x[-1])
    nb = max(1, min(bins, int(hi - lo) + 1))
    edges = np.linspace(lo, hi + 1e-9, nb + 1)
    bounds = np.empty(nb + 1, np.int64)
    bounds[0], bounds[-1] = 0, x.shape[0]
    inner = edges[1:-1]
    if x.dtype.kind == "i":  # an int compares as its float: x >= e <=> x >= ceil(e); no
        inner = np.ceil(inner).astype(x.dtype)  # float copy of 10M positions to search
    bounds[1:-1] = np.searchsorted(x, inner, side="left")
    b = np.flatnonzero(bounds[1:] > bounds[:-1])
    centers = (edges[b] + edges[b + 1]) / 2
    med = np.array([percentiles(y[bounds[i] : bounds[i + 1]], (50.0,))[50.0] for i in b])
    return centers, med.astype(np.float64)


def scatter_figure(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    title: str,
    xtitle: str,
    ytitle: str,
    max_points: int = MAX_POINTS,
    no_data_reason: str = "no samples",
    color: str = "#1565c0",
    hover: str = "%{x}, %{y}<extra></extra>",
) -> Figure:
    """A scatter of the finite (x, y) pairs, thinned to ``max_points`` by x order keeping
    each bucket's lowest and highest y (``minmax_keep``: spikes are not clipped)."""
    xa = np.asarray(x, np.float64)
    ya = np.asarray(y, np.float64)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    n = int(xa.shape[0])
    if n == 0:
        return empty_figure(title, no_data_reason)
    order = np.argsort(xa, kind="stable")
    xa, ya = xa[order], ya[order]
    keep = minmax_keep(ya, max_points)
    trace = {
        "type": "scatter",
        "mode": "markers",
        "x": values(xa[keep]),
        "y": values(ya[keep]),
        "marker": {"size": 4, "color": color},
        "hovertemplate": hover,
    }
    layout = _layout(title, xtitle, ytitle)
    if keep.shape[0] < n:
        layout["annotations"].append(downsample_note(int(keep.shape[0]), n))
    return {"data": [trace], "layout": layout}


def ttft_input_figure(
    input_tokens: npt.ArrayLike, ttft_ms: npt.ArrayLike, *, max_points: int = MAX_POINTS
) -> Figure:
    """TTFT (ms) of each successful request against its input length (tokens)."""
    inp = np.asarray(input_tokens, np.float64)
    inp = np.where(inp < 0, np.nan, inp)
    return scatter_figure(
        inp,
        ttft_ms,
        title="TTFT against input length",
        xtitle="input length (tokens)",
        ytitle="TTFT (ms)",
        max_points=max_points,
        no_data_reason="no successful request with a known input length",
        hover="%{x} tokens: %{y} ms<extra></extra>",
    )


def request_events_figure(
    t_ms: npt.ArrayLike,
    kind: npt.ArrayLike,
    tokens: npt.ArrayLike,
    *,
    max_points: int = 5 * MAX_POINTS,
) -> Figure:
    """One request's events on a time axis (ms since sent): cumulative tokens, one marker
    colour per event kind; hover shows the kind and the token delta."""
    t = np.asarray(t_ms, np.float64)
    kd = np.asarray(kind, np.int64)
    tk = np.asarray(tokens, np.int64)
    title = "Events of this request"
    total = int(t.shape[0])
    if total == 0:
        return empty_figure(title, "this request recorded no events")
    cum = np.cumsum(tk)
    keep = evenly(total, max_points)
    t, kd, tk, cum = t[keep], kd[keep], tk[keep], cum[keep]
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "tokens so far",
            "x": values(t),
            "y": cum.tolist(),
            "line": {"shape": "hv", "color": "#90a4ae", "width": 1},
            "hoverinfo": "skip",
        }
    ]
    for code in sorted(set(kd.tolist())):
        m = kd == code
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": KIND_NAMES.get(code, str(code)),
                "x": values(t[m]),
                "y": cum[m].tolist(),
                "customdata": tk[m].tolist(),
                "marker": {"size": 6, "color": KIND_COLORS.get(code, "#333")},
                "hovertemplate": "%{x} ms: +%{customdata} tokens (total %{y})<extra>"
                + KIND_NAMES.get(code, str(code))
                + "</extra>",
            }
        )
    layout = _layout(
        title, "time since the request was sent (ms)", "output tokens received (tokens)"
    )
    layout["yaxis"].update(int_axis(float(cum.max()) if cum.size else 1.0))
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.2}
    if keep.shape[0] < total:
        note = downsample_note(int(keep.shape[0]), total)
        note["text"] = f"downsampled: {keep.shape[0]:,} of {total:,} events"
        layout["annotations"].append(note)
    return {"data": data, "layout": layout}
