"""How much of a target's answers the client holds: ``ClientLimits`` (the run spec's
``limits``) and the run-wide ``BufferBudget``.

A target is hostile until bounded. The read callback appends a response's bytes to its
capture and decodes nothing (``app.client.http_stream``): these bounds are what keeps an
endless or enormous answer from exhausting the process, without touching how a normal
stream is read or timed.

* ``max_response_bytes``: one response's bytes (head included). Past it the request ends as
  an error, "response exceeded N bytes (max_response_bytes)". An error status's body is read
  up to ``ERROR_BODY_BYTES`` only (its message is all that is kept of it).
* ``max_event_bytes``: one SSE event, or a whole JSON answer (``stream: false``).
* ``max_response_events``: the events of one response (each decoded event costs memory far
  beyond its bytes).

A request failed by one of these keeps its first ``CUT_EVENTS_KEPT`` events (only those are
decoded), not the million a flood sends: its record stays small in the run.
* ``max_buffered_bytes``: the bytes every response capture of the run holds at once (those
  still streaming and those waiting to be decoded), each read counted with
  ``READ_COST`` bytes of bookkeeping. The read that takes the run past it ends its own
  request as an error naming the limit; the run goes on.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
DEFAULT_MAX_EVENT_BYTES = 1 << 20
DEFAULT_MAX_RESPONSE_EVENTS = 1_000_000
DEFAULT_MAX_BUFFERED_BYTES = 512 << 20
ERROR_BODY_BYTES = 64 << 10  # of an HTTP error answer's body, at most this much is read
CUT_EVENTS_KEPT = 1_000  # a response failed by a limit keeps its first events, this many
READ_COST = 128  # a read's bookkeeping in the capture: three list entries and their ints


class ClientLimits(BaseModel):
    """The client's bounds on what a target's answers may make it hold (bytes, events)."""

    model_config = ConfigDict(extra="forbid")

    max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES,
        ge=64 << 10,
        le=1 << 30,
        description="one response's bytes; a larger response fails its request",
    )
    max_event_bytes: int = Field(
        DEFAULT_MAX_EVENT_BYTES,
        ge=1 << 10,
        le=64 << 20,
        description="one SSE event's bytes, or a whole JSON (stream: false) answer's",
    )
    max_response_events: int = Field(
        DEFAULT_MAX_RESPONSE_EVENTS,
        ge=1_000,
        le=100_000_000,
        description="one response's SSE events; more fails its request",
    )
    max_buffered_bytes: int = Field(
        DEFAULT_MAX_BUFFERED_BYTES,
        ge=16 << 20,
        le=64 << 30,
        description="bytes all of a run's responses hold at once before they are decoded; "
        "the read that goes past it fails its request",
    )


class BufferBudget:
    """The run's ``max_buffered_bytes``: what its response captures hold now (``used``).

    The read callback adds each read (its bytes + ``READ_COST``) inline, for speed;
    ``release`` takes a capture's share back when it is decoded or dropped. One event loop
    uses it: no locking."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def release(self, capture_bytes: int, reads: int) -> None:
        self.used -= capture_bytes + READ_COST * reads

    @property
    def reason(self) -> str:
        return (
            f"response cut off: the run's buffered responses exceeded {self.limit:,} bytes "
            "(max_buffered_bytes)"
        )
