"""The simulator's ground truth: one ``Record`` per completion request (server clock:
``time.monotonic_ns()``) and the event kinds it is written in (``EVENT_KINDS``, ``K_*``).
Served as JSON by ``GET /_sim/ground_truth``: ``{"clock": "monotonic_ns", "pid", "config",
"requests": {request_id: {...}}}`` where request_id is the ``X-Request-Id`` header (or
``sim-<n>``) and each request has ``seq``, ``endpoint``, ``stream``, ``received_ns``,
``headers_ns``, ``closed_ns``, ``input_tokens``, ``output_tokens`` (planned), ``fault``,
``fault_ns``, ``fault_after_tokens``, ``status``, ``model`` (asked), ``session`` (its
X-Session-ID header) and columnar ``events``: ``t_ns`` (stamped
just before the write), ``due_ns`` (when the model said it was due), ``kind`` (one of
``EVENT_KINDS``) and ``tokens``. Events written together in one write share one stamp.
``received_ns`` is stamped when the read that completed the request returned. Kinds map onto
``app.domain.EventKind``: content -> CONTENT, reasoning -> REASONING, role and finish ->
ROLE, usage -> USAGE, done and malformed -> OTHER.
"""

from __future__ import annotations

from array import array
from typing import Any

from app.targets.sim_config import Fault
from app.targets.simulator.plan import Plan

EVENT_KINDS: tuple[str, ...] = (
    "role",  # role-only chunk (no token)
    "content",  # delta.content / text: token-bearing
    "reasoning",  # delta.reasoning_content: token-bearing
    "finish",  # empty delta with finish_reason (no token)
    "usage",  # choices [] with usage (no token)
    "done",  # data: [DONE]
    "malformed",  # a non-JSON data line (fault)
    "response",  # the whole non-streaming JSON response
    "error",  # an HTTP error response (fault)
)
K_ROLE, K_CONTENT, K_REASONING, K_FINISH, K_USAGE, K_DONE = 0, 1, 2, 3, 4, 5
K_MALFORMED, K_RESPONSE, K_ERROR = 6, 7, 8


class Record:
    """Ground truth of one request (server clock: ``time.monotonic_ns()``)."""

    __slots__ = (
        "closed_ns",
        "conn",
        "conn_request",
        "due_ns",
        "endpoint",
        "fault",
        "fault_after_tokens",
        "fault_ns",
        "first_byte_rx_ns",
        "first_content_send_ns",
        "first_content_written_ns",
        "headers_ns",
        "input_tokens",
        "kind",
        "model",
        "output_tokens",
        "received_ns",
        "rx_clock",
        "seq",
        "session",
        "spec",
        "status",
        "stream",
        "t_ns",
        "tokens",
    )

    def __init__(self, seq: int, plan: Plan, fault: Fault, received_ns: int) -> None:
        self.seq = seq
        self.endpoint = plan.endpoint
        self.stream = plan.stream
        self.input_tokens = plan.input_tokens
        self.output_tokens = plan.output_tokens
        self.model = plan.model  # the model the body asked for (else the served one)
        self.session: str | None = None  # the request's X-Session-ID header, if any
        self.fault = fault
        self.received_ns = received_ns
        self.first_byte_rx_ns = received_ns  # the request's first byte (see HttpProtocol)
        self.first_content_written_ns: int | None = None  # when that write call returned
        self.first_content_send_ns: int | None = None  # its send syscall (after TLS encrypts)
        self.rx_clock = "userspace"
        self.conn = 0
        self.conn_request = 0
        self.headers_ns: int | None = None
        self.closed_ns: int | None = None
        self.fault_ns: int | None = None
        self.fault_after_tokens: int | None = None
        self.status: int | None = None
        self.spec: dict[str, object] | None = None  # its draft steps (spec_decode), if any
        self.t_ns = array("q")
        self.due_ns = array("q")
        self.kind = array("b")
        self.tokens = array("i")

    def add(self, t_ns: int, due_ns: int, kind: int, tokens: int) -> None:
        self.t_ns.append(t_ns)
        self.due_ns.append(due_ns)
        self.kind.append(kind)
        self.tokens.append(tokens)

    def add_marks(self, t_ns: int, marks: list[int]) -> None:
        """Events written together at ``t_ns``; ``marks`` is ``[due, kind, tokens, ...]``."""
        for i in range(0, len(marks), 3):
            self.t_ns.append(t_ns)
            self.due_ns.append(marks[i])
            self.kind.append(marks[i + 1])
            self.tokens.append(marks[i + 2])

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "endpoint": self.endpoint,
            "stream": self.stream,
            "received_ns": self.received_ns,
            "first_byte_rx_ns": self.first_byte_rx_ns,
            "first_content_written_ns": self.first_content_written_ns,
            "first_content_send_ns": self.first_content_send_ns,
            "rx_clock": self.rx_clock,
            "conn": self.conn,
            "conn_request": self.conn_request,
            "headers_ns": self.headers_ns,
            "closed_ns": self.closed_ns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model": self.model,
            "session": self.session,
            "fault": self.fault.value,
            "fault_ns": self.fault_ns,
            "fault_after_tokens": self.fault_after_tokens,
            "status": self.status,
            "spec_decode": self.spec,
            "events": {
                "t_ns": self.t_ns.tolist(),
                "due_ns": self.due_ns.tolist(),
                "kind": [EVENT_KINDS[k] for k in self.kind],
                "tokens": self.tokens.tolist(),
            },
        }
