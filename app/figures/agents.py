"""An agent trace's session as a swim-lane timeline (pure): one lane per branch at each
depth, a bar per request from its send to its end, and before it, lighter, its wait from
ready (its parents' end plus its delay) to its send.

Lanes: the requests of one depth, in order of send, each take the first lane of that depth
whose last bar ended by their send (``depth d``, ``depth d.2``, ... for parallel branches),
so siblings running at once sit on lanes of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.analysis.agent_sessions import AgentRow
from app.figures.common import STATUS_COLORS, Figure, _layout, empty_figure

TITLE = "Session timeline"
WAIT_COLOR = "#bdbdbd"
MAX_SESSION_BARS = 2000


def lanes(rows: Sequence[AgentRow]) -> dict[int, str]:
    """Each sent request's lane label, by record index."""
    ends: dict[int, list[int]] = {}  # per depth: each lane's last end
    out: dict[int, str] = {}
    sent = [r for r in rows if r.sent_ns is not None and r.end_ns is not None]
    for r in sorted(sent, key=lambda r: (r.link.depth, r.sent_ns or 0, r.index)):
        assert r.sent_ns is not None and r.end_ns is not None
        lane_ends = ends.setdefault(r.link.depth, [])
        k = next((i for i, e in enumerate(lane_ends) if e <= r.sent_ns), len(lane_ends))
        if k == len(lane_ends):
            lane_ends.append(r.end_ns)
        else:
            lane_ends[k] = r.end_ns
        out[r.index] = f"depth {r.link.depth}" + (f".{k + 1}" if k else "")
    return out


def session_timeline(
    rows: Sequence[AgentRow], label: str, names: dict[int, str] | None = None
) -> Figure:
    """The swim lanes of one session's ``rows`` (times in ms from the session's start);
    ``names``: a request's name by record index (its trace request id)."""
    title = f"{TITLE}: {label}"
    lane = lanes(rows)
    drawn = [r for r in rows if r.index in lane][:MAX_SESSION_BARS]
    if not drawn:
        return empty_figure(title, "no request of this session was sent")
    roots = [r for r in rows if not r.link.parents]
    t0 = min((r.scheduled_ns - r.link.delay_ns for r in roots), default=0)
    names = names or {}

    def ms(t: int) -> float:
        return round((t - t0) / 1e6, 3)

    data: list[dict[str, Any]] = []
    waits = [r for r in drawn if (r.sent_ns or 0) > r.scheduled_ns]
    if waits:
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "ready → sent",
                "y": [lane[r.index] for r in waits],
                "base": [ms(r.scheduled_ns) for r in waits],
                "x": [ms(r.sent_ns or 0) - ms(r.scheduled_ns) for r in waits],
                "marker": {"color": WAIT_COLOR},
                "hovertemplate": "waited %{x} ms after ready<extra></extra>",
            }
        )
    for status, color in (("ok", STATUS_COLORS["ok"]), ("failed", STATUS_COLORS["error"])):
        sel = [r for r in drawn if r.ok == (status == "ok")]
        if not sel:
            continue
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "sent → end" if status == "ok" else "failed",
                "y": [lane[r.index] for r in sel],
                "base": [ms(r.sent_ns or 0) for r in sel],
                "x": [ms(r.end_ns or 0) - ms(r.sent_ns or 0) for r in sel],
                "text": [names.get(r.index, f"#{r.index}") for r in sel],
                "textposition": "inside",
                "marker": {"color": color},
                "customdata": [
                    [names.get(r.index, f"#{r.index}"), r.link.depth, ms(r.sent_ns or 0)]
                    for r in sel
                ],
                "hovertemplate": (
                    "%{customdata[0]} (depth %{customdata[1]})<br>sent %{customdata[2]} ms, "
                    "took %{x} ms<extra></extra>"
                ),
            }
        )
    order = sorted(set(lane.values()), key=lambda s: [float(x) for x in s[6:].split(".")])
    layout = _layout(title, "ms from the session's start", "", showlegend=True, barmode="overlay")
    layout["yaxis"] |= {"categoryorder": "array", "categoryarray": order[::-1]}
    layout["height"] = max(220, 60 + 28 * len(order))
    layout["legend"] = {"orientation": "h", "y": -0.25}
    return {"data": data, "layout": layout}
