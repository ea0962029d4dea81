"""TTFTC, time to first tool call: the first tool-call delta of a request's answer
(``delta.tool_calls[]``: the function's name or argument text; Responses'
``response.function_call_arguments.delta``; Anthropic's ``input_json_delta``:
``EventKind.TOOL_CALL``) -
the request's send, one sample per successful request that called a tool. Beside TTFT (the
first token-bearing event of any kind); stored per request in ``requests.metric_values``
(no column). A run without any tool call has no samples ("no tool calls in this run")."""

from __future__ import annotations

import numpy as np

from app.analysis.event_views import event_view
from app.domain import EventKind

from .base import F64, Metric, RunBasis

NO_TOOL_CALLS = "no tool calls in this run"


def _ttftc(b: RunBasis) -> F64 | None:
    if not bool(np.any(b.trace.ev_kind == EventKind.TOOL_CALL)):
        return None
    calls = event_view(b.trace, (EventKind.TOOL_CALL,), require_tokens=False)
    return b.since_sent(calls.first_t())


TTFTC = Metric(
    key="ttftc_ms",
    label="TTFTC",
    title="Time to first tool call",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    short="Time to tool call",
    per_request=_ttftc,
    no_data=NO_TOOL_CALLS,
    seed=8,
    # the run page's table (its figures and comparisons would hold no samples on the runs
    # without tool calls); the report, the CLI and the exports show every metric
    views=frozenset(("page",)),
    surfaces=frozenset(("chat", "responses", "anthropic-messages")),
)
