"""What the agent-trace dataset types (``agentic``, ``otel``) build: each session's requests
as a DAG (``AgentTrace``), checked before anything is sent.

A request (``AgentNode``) is due when all its parents (requests of its session) have ended,
plus its recorded delay (tool execution, think time); a root is due at its session's start
plus its delay. Its prompt is built when it is due (``app.client.agent_sessions``): with
``carry_reply`` it continues its first parent's conversation (that parent's messages, the
reply the server actually streamed as an ``assistant`` message, then its recorded tool
results as ``tool`` messages), then its own messages; a ``{{reply:<request_id>}}`` in one
of its own messages' text is replaced by that parent's actual reply.

Refused naming the line and field (``graph_of``): a request id given twice in a session, a
parent id that never appears in its session, a cycle, a negative delay, session start
times going back, a placeholder naming no parent of the request, tool results without a
parent's reply to follow.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER = re.compile(r"\{\{reply:([^{}]{1,256})\}\}")
NS_PER_MS = 1_000_000
MAX_REPLAY_MS = 365 * 86_400_000  # as ``trace_times``' (this module imports no dataset's)
MAX_DELAY_MS = 86_400_000.0  # one request's recorded delay: a day at most


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A recorded tool result, sent as a ``tool`` message after the parent's reply (whose
    assistant message then carries the matching ``tool_calls`` entry)."""

    call_id: str
    name: str
    content: str


@dataclass(frozen=True, slots=True)
class RawNode:
    """One request as a trace file gives it (ids as strings, times in ms), before checks."""

    lineno: int
    session_id: str
    request_id: str
    parent_ids: tuple[str, ...]
    delay_ms: float
    messages: tuple[dict[str, Any], ...]
    output_len: int
    tool_results: tuple[ToolResult, ...] = ()
    carry_reply: bool = False
    timestamp_ms: float | None = None  # the session's start (its first line's)
    where: str = "dataset_path line"  # how errors name the line


@dataclass(frozen=True, slots=True)
class AgentNode:
    session: int  # the session's number (0-based, order of first appearance)
    request_id: str
    parents: tuple[int, ...]  # node numbers (positions in ``AgentTrace.nodes``)
    delay_ns: int
    messages: tuple[dict[str, Any], ...]  # its own messages
    output_len: int
    tool_results: tuple[ToolResult, ...]
    carry_reply: bool
    depth: int
    lineno: int
    turn: int  # its position in its session (1-based, file order)


@dataclass(frozen=True, slots=True)
class AgentTrace:
    nodes: list[AgentNode]  # in file order
    session_start_ns: list[int]  # each session's start, ns from the measured phase's start
    session_ids: list[str]
    children: list[tuple[int, ...]] = field(default_factory=list)  # per node

    @property
    def sessions(self) -> int:
        return len(self.session_ids)


def _where(n: RawNode, field_name: str) -> str:
    return f"{n.where} {n.lineno}: '{field_name}'"


def graph_of(
    raw: list[RawNode], speedup: float = 1.0, max_sessions: int | None = None
) -> AgentTrace:
    """The checked DAG of ``raw`` (file order): the first ``max_sessions`` sessions (None:
    all); delays and start times divided by ``speedup``."""
    if not raw:
        raise ValueError("dataset_path: no requests in the file")
    sessions: dict[str, int] = {}
    starts: list[float] = []
    ids: dict[tuple[int, str], int] = {}
    kept: list[RawNode] = []
    for n in raw:
        if n.session_id not in sessions:
            if max_sessions is not None and len(sessions) >= max_sessions:
                continue
            if n.timestamp_ms is not None and starts and n.timestamp_ms < starts[-1]:
                raise ValueError(
                    f"{_where(n, 'timestamp_ms')} {n.timestamp_ms:g} is earlier than the "
                    f"previous session's start {starts[-1]:g} (session start times must not "
                    "decrease)"
                )
            sessions[n.session_id] = len(sessions)
            previous = starts[-1] if starts else 0.0
            starts.append(n.timestamp_ms if n.timestamp_ms is not None else previous)
        elif n.timestamp_ms is not None and n.timestamp_ms != starts[sessions[n.session_id]]:
            raise ValueError(
                f"{_where(n, 'timestamp_ms')} is the session's start: give it on the "
                "session's first line only (or the same value)"
            )
        if not n.delay_ms >= 0:
            raise ValueError(f"{_where(n, 'delay_ms')} must be >= 0 ms, got {n.delay_ms:g}")
        if n.delay_ms > MAX_DELAY_MS:
            raise ValueError(f"{_where(n, 'delay_ms')} is over a day ({n.delay_ms:g} ms)")
        key = (sessions[n.session_id], n.request_id)
        if key in ids:
            raise ValueError(
                f"{_where(n, 'request_id')} {n.request_id!r} is given twice in session "
                f"{n.session_id!r} (first on line {kept[ids[key]].lineno})"
            )
        ids[key] = len(kept)
        kept.append(n)
    if max_sessions is not None and len(sessions) < max_sessions:
        raise ValueError(
            f"num_prompts: {max_sessions} sessions requested, the trace has {len(sessions)} "
            "(give num_prompts that many or fewer, or leave it out to replay the whole trace)"
        )
    parents: list[tuple[int, ...]] = []
    for n in kept:
        s = sessions[n.session_id]
        ps: list[int] = []
        for pid in n.parent_ids:
            k = ids.get((s, pid))
            if k is None:
                raise ValueError(
                    f"{_where(n, 'parent_ids')}: {pid!r} is no request of session {n.session_id!r}"
                )
            if k not in ps:
                ps.append(k)
        parents.append(tuple(ps))
        own = set(n.parent_ids)
        for m in n.messages:
            for found in PLACEHOLDER.findall(_text_of(m)):
                if found not in own:
                    raise ValueError(
                        f"{_where(n, 'messages')}: {{{{reply:{found}}}}} names no parent of "
                        f"request {n.request_id!r} (its parent_ids: {sorted(own)})"
                    )
        if n.tool_results and not (n.carry_reply and n.parent_ids):
            raise ValueError(
                f"{_where(n, 'tool_results')}: tool results follow the parent's reply: "
                "give include_parent_reply true and a parent"
            )
    depth = _depths(kept, parents)
    children: list[list[int]] = [[] for _ in kept]
    for k, node_parents in enumerate(parents):
        for p in node_parents:
            children[p].append(k)
    t0 = starts[0]
    start_ns: list[int] = []
    for sid, t in zip(sessions, starts, strict=True):
        if (t - t0) / speedup > MAX_REPLAY_MS:
            raise ValueError(
                f"dataset_path: session {sid!r} starts {t - t0:g} ms after the first: at "
                f"speedup {speedup:g} the replay would last over 365 days"
            )
        start_ns.append(round((t - t0) * NS_PER_MS / speedup))
    turns: dict[int, int] = {}
    nodes: list[AgentNode] = []
    for k, n in enumerate(kept):
        s = sessions[n.session_id]
        turns[s] = turns.get(s, 0) + 1
        nodes.append(
            AgentNode(
                session=s,
                request_id=n.request_id,
                parents=parents[k],
                delay_ns=round(n.delay_ms * NS_PER_MS / speedup),
                messages=n.messages,
                output_len=n.output_len,
                tool_results=n.tool_results,
                carry_reply=n.carry_reply and bool(parents[k]),
                depth=depth[k],
                lineno=n.lineno,
                turn=turns[s],
            )
        )
    return AgentTrace(nodes, start_ns, list(sessions), [tuple(c) for c in children])


def _text_of(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = [p.get("text") for p in c if isinstance(p, dict)]
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def _depths(nodes: list[RawNode], parents: list[tuple[int, ...]]) -> list[int]:
    """Each node's depth (Kahn's order); a cycle is refused naming a line on it."""
    n = len(nodes)
    pending = [len(p) for p in parents]
    children: list[list[int]] = [[] for _ in range(n)]
    for k, ps in enumerate(parents):
        for p in ps:
            children[p].append(k)
    depth = [0] * n
    queue = deque(k for k in range(n) if pending[k] == 0)
    done = 0
    while queue:
        k = queue.popleft()
        done += 1
        for c in children[k]:
            depth[c] = max(depth[c], depth[k] + 1)
            pending[c] -= 1
            if pending[c] == 0:
                queue.append(c)
    if done < n:
        cycle = _a_cycle(parents, [k for k in range(n) if pending[k] > 0])
        first = nodes[cycle[0]]
        path = " -> ".join(nodes[k].request_id for k in [*cycle, cycle[0]])
        raise ValueError(
            f"{_where(first, 'parent_ids')}: a cycle in session {first.session_id!r}: {path} "
            "(a request cannot wait for itself)"
        )
    return depth


def _a_cycle(parents: list[tuple[int, ...]], stuck: list[int]) -> list[int]:
    """One cycle among the nodes Kahn's order could not reach (each has a stuck parent),
    in file order of its first node."""
    stuck_set = set(stuck)
    k = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while k not in seen:
        seen[k] = len(path)
        path.append(k)
        k = next(p for p in parents[k] if p in stuck_set)
    cycle = path[seen[k] :]
    i = cycle.index(min(cycle))
    return cycle[i:] + cycle[:i]
