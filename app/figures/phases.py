"""The run page's phase figures (SPEC 1b).

* ``phase_breakdown_figure``: each request's time to first token by phase, one stacked bar
  per request (sampled evenly by index past ``MAX_BARS``): connect, TLS, sending, waiting,
  first token; the stack's height is the user-perceived TTFT. The queue wait is left out of
  the stack (in a closed loop it is the wait for a slot, not part of the request) and shown
  in the hover.
* ``wait_figures``: every measured request's queue wait and send lag
  (``app.analysis.phases``) against the moment a slot and a connection were free for it;
  the initial burst's send lags, which the run's send lag statistics leave out, drawn apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.metrics import valid_requests
from app.analysis.phases import NO_PHASES, send_lags
from app.domain import RunTrace
from app.figures.common import (
    MAX_POINTS,
    Figure,
    _layout,
    downsample_note,
    empty_figure,
    evenly,
    scatter_figure,
    values,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
SEND_LAG_TITLE = "Send lag (what the client added before the first byte left)"
QUEUE_TITLE = "Queue wait (due → a slot and a connection free)"
FREE_AXIS = "slot and connection free, since run start (s)"
NO_QUEUE = "no queue wait recorded (an import, or a run from before phases were recorded)"

MAX_BARS = 400
STACK = (
    ("connect", "connect", "#8c564b"),
    ("tls", "TLS", "#e377c2"),
    ("sending", "sending", "#7f7f7f"),
    ("waiting", "waiting", "#1f77b4"),
    ("first_token", "first token", "#ff7f0e"),
)
TITLE = "Time to first token by phase (stack = connect + TLS + TTFT)"


def phase_breakdown_figure(trace: RunTrace, indexes: Any = None) -> Figure:
    """Stacked phases (ms) of the successful requests, x = request index."""
    if trace.phases is None:
        return empty_figure(TITLE, NO_PHASES)
    ok = np.flatnonzero(valid_requests(trace))
    if ok.size == 0:
        return empty_figure(TITLE, "no successful request")
    pick = ok[evenly(int(ok.size), MAX_BARS)]
    idx = np.asarray(indexes if indexes is not None else np.arange(trace.n_requests))[pick]
    queued = trace.phases["queued"][pick]
    queued_ms = np.where(queued >= 0, queued / 1e6, np.nan)
    data: list[dict[str, Any]] = []
    for key, label, color in STACK:
        arr = trace.phases[key][pick]
        ms = np.where(arr >= 0, arr / 1e6, 0.0)
        data.append(
            {
                "type": "bar",
                "name": label,
                "x": idx.tolist(),
                "y": values(ms, 4),
                "marker": {"color": color},
                "customdata": values(queued_ms, 3),
                "hovertemplate": (
                    f"request %{{x}}<br>{label} %{{y:.3f}} ms"
                    "<br>queued before it %{customdata:.3f} ms<extra></extra>"
                ),
            }
        )
    layout = _layout(TITLE, "request index (count)", "time (ms)", barmode="stack", showlegend=True)
    layout["legend"] = {"orientation": "h", "y": -0.25}
    layout["height"] = 360
    layout["xaxis"]["tickformat"] = ",d"
    if pick.size < ok.size:
        layout["annotations"].append(downsample_note(int(pick.size), int(ok.size)))
    return {"data": data, "layout": layout}


def wait_figures(
    trace: RunTrace, scheduled_ns: I64 | None, turns: I64 | None, *, max_points: int = MAX_POINTS
) -> tuple[Figure, Figure]:
    """(send lag, queue wait) of every measured request; ``scheduled_ns`` and ``turns``
    (-1 for single requests) aligned with the trace. x: when a slot and a connection were
    free (scheduled + queue wait)."""
    ph = trace.phases
    if scheduled_ns is None or ph is None or scheduled_ns.shape[0] != trace.n_requests:
        return empty_figure(SEND_LAG_TITLE, NO_QUEUE), empty_figure(QUEUE_TITLE, NO_QUEUE)
    turn = turns if turns is not None else np.full(trace.n_requests, -1, np.int64)
    queued = ph["queued"]
    lags = send_lags(scheduled_ns, trace.sent_ns, queued, ph["connect"], ph["tls"], turn)
    free_s = np.where(queued >= 0, (scheduled_ns + np.maximum(queued, 0)) / 1e9, np.nan)
    lag_ms = lags.lag_ns / 1e6
    b = lags.burst
    send = _scatter(
        SEND_LAG_TITLE,
        "send lag (ms)",
        [
            (free_s[~b], lag_ms[~b], "requests", "#6a1b9a"),
            (free_s[b], lag_ms[b], "initial burst (not in the p99)", "#9e9e9e"),
        ],
        "no request was sent",
        max_points,
    )
    queue_ms = np.where(queued >= 0, queued / 1e6, np.nan)
    queue = _scatter(
        QUEUE_TITLE, "queue wait (ms)", [(free_s, queue_ms, "requests", "#00838f")], NO_QUEUE,
        max_points,
    )  # fmt: skip
    return send, queue


def _scatter(
    title: str,
    ytitle: str,
    series: list[tuple[F64, F64, str, str]],
    reason: str,
    max_points: int,
) -> Figure:
    """One marker trace per (x, y, name, colour) series with points (``scatter_figure``'s,
    each thinned to ``max_points`` keeping spikes), a legend when there are two."""
    data: list[dict[str, Any]] = []
    total = 0
    for x, y, name, color in series:
        n = int((np.isfinite(x) & np.isfinite(y)).sum())
        if n == 0:
            continue
        fig = scatter_figure(
            x, y, title=title, xtitle=FREE_AXIS, ytitle=ytitle, max_points=max_points,
            color=color, hover="free at %{x:.3f} s: %{y} ms<extra></extra>",
        )  # fmt: skip
        data.append(fig["data"][0] | {"name": name})
        total += n
    if not data:
        return empty_figure(title, reason)
    layout = _layout(title, FREE_AXIS, ytitle, showlegend=len(data) > 1)
    shown = sum(len(t["x"]) for t in data)
    if shown < total:
        layout["annotations"].append(downsample_note(shown, total))
    return {"data": data, "layout": layout}
