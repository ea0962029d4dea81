"""Shared domain types: what one request recorded, the columnar trace, and the states of
requests and runs (what a run asks for, ``RunSpec``, is the client's: ``app.client.spec``).

Everything here is plain data (no I/O). The load generator produces ``RequestRecord``s,
storage persists them, and ``app.analysis`` computes metrics from a ``RunTrace``.

Times are integer nanoseconds on the client's monotonic clock, relative to the run's start
(``RunTrace.start_mono_ns`` is that start on the absolute ``time.monotonic_ns()`` clock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
BoolArr = npt.NDArray[np.bool_]


class EventKind(enum.IntEnum):
    """What one SSE event carried."""

    CONTENT = 0  # generated answer text (a token-bearing chunk)
    REASONING = 1  # generated reasoning text (token-bearing, but not "output" text)
    ROLE = 2  # role-only chunk, empty delta, finish-only chunk: no token
    USAGE = 3  # usage-only chunk (choices empty): no token
    OTHER = 4  # comment / keep-alive / [DONE] / unparseable-but-ignored: no token
    # the whole answer of a surface that generates no tokens (embeddings, rerank): no token;
    # its tokens column holds the items it answered (inputs embedded, documents scored)
    ANSWER = 5
    # a tool call's streamed delta (``delta.tool_calls[]``: its function's name, its argument
    # text): generated output, token-bearing like content (docs/endpoints.md, tool calls)
    TOOL_CALL = 6


TOKEN_KINDS = (EventKind.CONTENT, EventKind.REASONING, EventKind.TOOL_CALL)

# A request's phases (SPEC 1b), in order; ``RequestRecord.<name>_ns`` holds each duration.
PHASES: tuple[str, ...] = ("queued", "connect", "tls", "sending", "waiting", "first_token")


class RequestStatus(enum.StrEnum):
    """How one request ended. ``ERROR`` and ``TIMEOUT`` are the target's failures (the error
    rate counts them); ``CANCELLED`` is the client's cut (a user's stop or cancel, the run's
    time limit): sent, but no error (``app.analysis.trust``)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


class RunStatus(enum.StrEnum):
    """A run's state (``app.analysis.trust.run_status`` decides the final ones): ``CANCELLED``
    when the user stopped it, whatever it stored; ``PARTIAL`` when over its error bound or
    it lost requests; how it reads is ``app.analysis.verdict``."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARTIAL = "partial"


class ClockSource(enum.StrEnum):
    KERNEL = "kernel"  # SO_TIMESTAMPNS receive timestamps (Linux, plain HTTP)
    USERSPACE = "userspace"  # time.monotonic_ns() when the read returned
    IMPORTED = "imported"  # times came from a file


MAX_JSON_DEPTH = 32  # nesting accepted in free-form JSON fields (extra_body, load_stats)


def json_depth(value: object) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar: 0), counted without recursion
    so a hostile value cannot exhaust the stack."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: list[object] = list(v.values())
        elif isinstance(v, list | tuple):
            children = list(v)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((c, depth + 1) for c in children)
    return deepest


@dataclass(frozen=True, slots=True)
class AgentLink:
    """An agent trace's request in its session's DAG: the record indices of its parents
    (requests of the same session), its depth (0: a root; else 1 + its deepest parent's)
    and its recorded delay (ns, after the speedup): it was due at its parents' latest end
    plus this delay (a root: at its session's start plus it)."""

    parents: tuple[int, ...]
    depth: int
    delay_ns: int

    def to_values(self) -> dict[str, object]:
        """As stored in ``requests.metric_values`` (``AGENT_KEYS``)."""
        return {
            AGENT_KEYS[0]: list(self.parents),
            AGENT_KEYS[1]: self.depth,
            AGENT_KEYS[2]: self.delay_ns,
        }

    @staticmethod
    def from_values(raw: object) -> AgentLink | None:
        """The link a stored ``metric_values`` holds; None when it holds none (or one that
        is not well formed: never a wrong parent)."""
        if not isinstance(raw, dict):
            return None
        parents, depth, delay = (raw.get(k) for k in AGENT_KEYS)
        if not isinstance(parents, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in parents
        ):
            return None
        if not isinstance(depth, int | float) or not isinstance(delay, int | float):
            return None
        return AgentLink(tuple(parents), int(depth), int(delay))


# the keys of an agent trace's request in ``requests.metric_values`` (beside the metrics')
AGENT_KEYS = ("agent_parents", "agent_depth", "agent_delay_ns")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client observed it. Event arrays are parallel, in arrival order."""

    index: int
    scheduled_ns: int  # when the load shape scheduled it (run-relative)
    sent_ns: int | None  # when the client started it (None: never sent)
    end_ns: int | None  # when it finished: stream end, error or timeout
    status: RequestStatus
    error: str | None = None
    http_status: int | None = None
    input_tokens: int | None = None  # the prompt count metrics use (server usage where given)
    output_tokens: int | None = None  # the count metrics use (see token_source)
    tokenizer_output_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    # prompt tokens the server served from its prefix cache (usage.prompt_tokens_details.
    # cached_tokens or llama.cpp's timings.cache_n); None where it did not say (0013)
    cached_prompt_tokens: int | None = None
    token_source: Literal["usage", "tokenizer", "imported"] | None = None
    done_ns: int | None = None  # server's "complete" signal ([DONE] or end of stream)
    warmup: bool = False
    # phases (SPEC 1b), durations in ns; None where the phase did not happen or is unknown
    queued_ns: int | None = None  # due -> a slot and a connection were free
    connect_ns: int | None = None  # TCP connect (None: a reused connection)
    tls_ns: int | None = None  # TLS handshake
    sending_ns: int | None = None  # first byte -> last byte of the request left
    waiting_ns: int | None = None  # last byte sent -> response head read
    first_token_ns: int | None = None  # response head -> first token-bearing chunk
    conn_id: int | None = None  # the run's connection number the request used
    conn_reused: bool | None = None  # sent on a connection an earlier request had used
    retries: int = 0  # sent again on a new connection after a reused one failed
    # multi-turn sessions: the session's number (0-based) and the turn's (1-based); None for
    # single requests (stored as requests.session_idx / turn_idx, migration 0012)
    session: int | None = None
    turn: int | None = None
    # a run over several load processes (app.client.shards): the process that sent it
    # (stored as requests.process_idx, migration 0019)
    process: int | None = None
    # a run dealt over workers (RunSpec.shards): the shard that sent it (requests.shard_idx,
    # migration 0022; set by the server from the shard's lease)
    shard: int | None = None
    # a run of several models or targets (app.client.routing): the model and the base URL
    # it used; None for a run of one (stored as requests.model / requests.target, 0021)
    model: str | None = None
    target: str | None = None
    # an agent trace's request (app.client.agent_sessions): its parents, depth and recorded
    # delay; stored in requests.metric_values (AGENT_KEYS, no migration); None otherwise
    agent: AgentLink | None = None
    # the prompt length by the client's tokenizer (in memory only: not stored, not on the wire)
    tokenizer_input_tokens: int | None = None
    event_t_ns: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    event_bytes: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    event_kind: I8 = field(default_factory=lambda: np.zeros(0, np.int8))
    event_tokens: I32 = field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass(slots=True)
class RunTrace:
    """Columnar view of a run's measured (non-warm-up) requests, for fast analysis.

    Per-request arrays have length R; events of request i are
    ``ev_*[ev_offsets[i]:ev_offsets[i+1]]``. ``sent_ns`` / ``end_ns`` are -1 where unknown.
    ``summary_only`` runs (imported logs) have only first/last token events: per-token
    views must say "no per-token data" instead of computing ITL.
    """

    sent_ns: I64
    end_ns: I64
    ok: BoolArr
    status: list[RequestStatus]
    errors: list[str | None]
    input_tokens: I64  # -1 where unknown
    output_tokens: I64  # -1 where unknown
    ev_offsets: I64
    ev_t_ns: I64
    ev_kind: I8
    ev_tokens: I32
    summary_only: bool = False
    clock_source: ClockSource = ClockSource.USERSPACE
    # per-request phase durations (ns, -1 where the phase did not happen), keyed by PHASES;
    # None when the run recorded none (imports, runs from before phases were recorded)
    phases: dict[str, I64] | None = None

    @property
    def n_requests(self) -> int:
        return int(self.sent_ns.shape[0])

    @property
    def n_events(self) -> int:
        return int(self.ev_t_ns.shape[0])


def trace_from_records(
    records: list[RequestRecord],
    *,
    include_warmup: bool = False,
    summary_only: bool = False,
    clock_source: ClockSource = ClockSource.USERSPACE,
) -> RunTrace:
    """Concatenate request records into a ``RunTrace`` (warm-up requests dropped by default)."""
    recs = [r for r in records if include_warmup or not r.warmup]
    n = len(recs)
    counts = np.fromiter((r.event_t_ns.shape[0] for r in recs), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])

    def cat(attr: str, dtype: type) -> npt.NDArray[np.generic]:
        if n == 0:
            return np.zeros(0, dtype)
        return np.concatenate([getattr(r, attr) for r in recs]).astype(dtype, copy=False)

    def col(values: list[int | None]) -> I64:
        return np.array([-1 if v is None else v for v in values], np.int64)

    phases: dict[str, I64] | None = None
    if any(r.conn_id is not None or r.queued_ns is not None for r in recs):
        phases = {p: col([getattr(r, f"{p}_ns") for r in recs]) for p in PHASES}

    return RunTrace(
        sent_ns=col([r.sent_ns for r in recs]),
        end_ns=col([r.end_ns for r in recs]),
        ok=np.array([r.status is RequestStatus.OK for r in recs], np.bool_),
        status=[r.status for r in recs],
        errors=[r.error for r in recs],
        input_tokens=col([r.input_tokens for r in recs]),
        output_tokens=col([r.output_tokens for r in recs]),
        ev_offsets=offsets,
        ev_t_ns=cat("event_t_ns", np.int64),  # type: ignore[arg-type]
        ev_kind=cat("event_kind", np.int8),  # type: ignore[arg-type]
        ev_tokens=cat("event_tokens", np.int32),  # type: ignore[arg-type]
        summary_only=summary_only,
        clock_source=clock_source,
        phases=phases,
    )


F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class PerRequestMetrics:
    """Per-request latencies in ns, aligned with a ``RunTrace``; NaN where undefined.

    ``tpot_ns`` is NaN when a request has fewer than 2 output tokens (SPEC 1: never 0).
    Failed requests have NaN everywhere (they are never latency samples).
    """

    ttft_ns: F64  # first token-bearing chunk (content or reasoning) - sent
    ttfot_ns: F64  # first *content* (non-reasoning) chunk - sent
    e2e_ns: F64  # last token-bearing chunk - sent
    tpot_ns: F64  # (tn - t1) / (n - 1)
    n_tokens: I64  # output tokens used (-1 unknown)
    # the other per-request values read from the events, by metric key (base unit, ns), that
    # have no column of their own: stored as ``requests.metric_values`` (no migration)
    extra: dict[str, F64] = field(default_factory=dict)
