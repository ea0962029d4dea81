"""The run page's breakdown of each request's time to first token into its phases (SPEC 1b).

One stacked bar per request (sampled evenly by index past ``MAX_BARS``): connect, TLS,
sending, waiting, first token; the stack's height is the user-perceived TTFT. Queueing is
left out of the stack (in a closed loop it is the wait for a slot, not part of the request)
and shown in the hover.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.analysis.metrics import valid_requests
from app.analysis.phases import NO_PHASES
from app.domain import RunTrace
from app.figures.common import Figure, _layout, downsample_note, empty_figure, evenly, values

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
