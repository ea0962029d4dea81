"""Agent traces (datasets ``agentic``, ``otel``: ``app.client.datasets.agent_graph``): each
session's requests as a DAG, on the runner's event loop.

* A request is ready when every parent has ended (its response's end on the wire,
  ``RawStream.wire_end_ns``: the record's ``end_ns``, or for a body the client closed
  unfinished after ``[DONE]``, that close) plus its recorded delay; a root at its
  session's start (the measured phase's start + the session's offset) plus its delay.
  Sibling branches (subagents) run in parallel: each request is its own task.
* Its prompt is built as soon as its parents have ended (before its delay is waited out):
  with ``carry_reply``, its first parent's messages, that parent's reply as the server
  streamed it (an ``assistant`` message, with a ``tool_calls`` entry per recorded tool
  result), the tool results as ``tool`` messages, then its own messages, in which
  ``{{reply:<request_id>}}`` is replaced by that parent's reply.
* It is then sent at its ready time on a free slot (``max_concurrency`` bounds requests in
  flight, not sessions): its record's ``scheduled_ns`` is the ready time, ``queued_ns``
  its wait for a slot; ``agent`` holds its parents' record indices, depth and delay. A
  child ready the moment its last parent ended (no delay) is sent from the read callback
  where that reply ended, as a session's next turn is (``app.client.sessions``): no wait
  for a task to be scheduled behind the loop's round of reads.
* A request that fails (HTTP error, broken stream, an error event, no token) is recorded;
  its descendants are not sent (``counts["unsent"]``); other branches go on.
* Record indices follow the trace's file order after the warm-ups (none: refused);
  ``X-Request-Id`` is ``<run_tag>-s<session>-t<position in the session, 1-based>``.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

from app.client.datasets.agent_graph import PLACEHOLDER, AgentNode, AgentTrace
from app.client.datasets.base import Prompt
from app.client.http_request import finish_request
from app.client.http_stream import StreamRequest
from app.client.raw_stream import RawStream
from app.client.sessions import (
    BodyTemplate,
    SessionHost,
    body_template,
    dumps,
    reply_text,
    turn_body,
)
from app.domain import AgentLink

__all__ = ["drive_agents", "messages_of"]


def messages_of(
    node: AgentNode,
    trace: AgentTrace,
    sent: list[list[dict[str, Any]] | None],
    replies: list[str | None],
) -> list[dict[str, Any]]:
    """The messages ``node`` sends, once its parents have replied (module docstring)."""
    out: list[dict[str, Any]] = []
    if node.carry_reply:
        p = node.parents[0]
        before = sent[p]
        reply = replies[p]
        assert before is not None and reply is not None
        assistant: dict[str, Any] = {"role": "assistant", "content": reply}
        if node.tool_results:
            assistant["tool_calls"] = [
                {
                    "id": t.call_id,
                    "type": "function",
                    "function": {"name": t.name, "arguments": "{}"},
                }
                for t in node.tool_results
            ]
        out += [*before, assistant]
        out += [
            {"role": "tool", "tool_call_id": t.call_id, "content": t.content}
            for t in node.tool_results
        ]
    by_id = {trace.nodes[p].request_id: replies[p] for p in node.parents}

    def fill(m: dict[str, Any]) -> dict[str, Any]:
        c = m.get("content")
        if isinstance(c, str) and "{{reply:" in c:
            return {**m, "content": PLACEHOLDER.sub(lambda g: by_id.get(g[1]) or "", c)}
        return m

    return out + [fill(m) for m in node.messages]


class _Dag:
    """The replay's state: what each request sent and received, its parents left."""

    def __init__(self, host: SessionHost, trace: AgentTrace, first_index: int) -> None:
        self.host = host
        self.trace = trace
        self.first = first_index
        n = len(trace.nodes)
        self.pending = [len(node.parents) for node in trace.nodes]
        self.sent: list[list[dict[str, Any]] | None] = [None] * n
        self.replies: list[str | None] = [None] * n
        self.end_ns = [0] * n
        self.sent_json = [b""] * n  # the messages sent, serialised (the list's inside)
        self.sent_tokens = [0] * n
        self.heads: list[bytes | None] = [None] * n
        self.handled = [False] * n  # its end seen (``ended``)
        self.templates: dict[tuple[int, int], BodyTemplate | None] = {}
        self.error: BaseException | None = None
        # one model and one target per session (app.client.routing)
        self.routes = {s: host.session_route(s) for s in {n.session for n in trace.nodes}}

    def start(self, k: int, ready_ns: int) -> None:
        task = asyncio.create_task(self.run(k, ready_ns))
        self.host.tasks.add(task)
        task.add_done_callback(self.done)

    def done(self, task: asyncio.Task[None]) -> None:
        self.host.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()

    def head(self, rid: str, session: int) -> bytes:
        return self.host.head(rid, self.routes[session])

    def prepare(self, k: int) -> tuple[str, bytes]:
        """Request ``k``'s id and bytes, its parents having replied: what its send needs,
        no more (``sent_prompt`` counts its tokens after the send). A carried
        conversation's messages are serialised once: the parent's JSON is reused, only
        what follows it is added (``sessions.History``'s way)."""
        host = self.host
        node = self.trace.nodes[k]
        rid = f"{host.run_tag}-s{node.session}-t{node.turn}"
        route = self.routes[node.session]
        spec = self.host.route_spec(route)
        head = self.heads[k] or self.head(rid, node.session)
        msgs = messages_of(node, self.trace, self.sent, self.replies)
        parts: list[bytes] = []
        new = msgs
        if node.carry_reply:
            p = node.parents[0]
            before = self.sent[p]
            assert before is not None
            if self.sent_json[p]:
                parts.append(self.sent_json[p])
            new = msgs[len(before) :]
        parts += [dumps(m) for m in new]
        inner = b",".join(parts)
        key = (route.model_idx, node.output_len)
        if key not in self.templates:
            self.templates[key] = body_template(spec, node.output_len)
        template = self.templates[key]
        body = template.body(inner) if template else turn_body(spec, msgs, node.output_len)
        self.sent[k], self.sent_json[k] = msgs, inner
        return rid, finish_request(head, body)

    def sent_prompt(self, k: int) -> Prompt:
        """Request ``k``, just sent: its prompt as recorded (its tokens counted, a carried
        conversation's from its parent's count); while its reply streams, its children's
        request heads are built and, when it fans out, a connection opened ahead for each
        child beyond the first (``app.client.preconnect``)."""
        node = self.trace.nodes[k]
        msgs = self.sent[k]
        assert msgs is not None
        tokens = 0
        new = msgs
        if node.carry_reply:
            p = node.parents[0]
            tokens = self.sent_tokens[p]
            new = msgs[len(self.sent[p] or ()) :]
        count = self.host.tok.count
        tokens += sum(count(m["content"]) for m in new if isinstance(m.get("content"), str))
        self.sent_tokens[k] = tokens
        fan_out = len(self.trace.children[k])
        if fan_out > 1:  # a connection ready for each child where its reply ends
            self.host.open_ahead(self.lane(k), fan_out - 1)
        for c in self.trace.children[k]:
            if self.heads[c] is None:
                child = self.trace.nodes[c]
                rid_c = f"{self.host.run_tag}-s{child.session}-t{child.turn}"
                self.heads[c] = self.head(rid_c, child.session)
        return Prompt(None, msgs, tokens, node.output_len)

    def lane(self, k: int) -> int:
        return self.routes[self.trace.nodes[k].session].lane

    def link(self, k: int) -> AgentLink:
        node = self.trace.nodes[k]
        return AgentLink(tuple(self.first + p for p in node.parents), node.depth, node.delay_ns)

    async def run(self, k: int, ready_ns: int) -> None:
        """Request ``k``: built now, sent at ``ready_ns`` on a free slot."""
        host = self.host
        node = self.trace.nodes[k]
        rid, req = self.prepare(k)
        prompt = self.sent_prompt(k)  # counted before its time: nothing waits on it here
        if host.halted:
            return
        if ready_ns > time.monotonic_ns():
            await host.wait_until(ready_ns, hold=True)
            if host.halted:
                return
        waited = host.sem.locked()
        await host.sem.acquire()
        due = time.monotonic_ns() if waited else ready_ns
        if host.halted:
            host.sem.release()
            return
        try:
            stream = host.send_turn(rid, req, partial(self.ended, k), self.lane(k))
        except BaseException:
            host.sem.release()
            raise
        raw = await host.track_turn(
            self.first + k, prompt, node.session, node.turn, stream, due, ready_ns,
            agent=self.link(k), route=self.routes[node.session],
        )  # fmt: skip
        self.after(k, raw)

    async def track(self, k: int, stream: StreamRequest | RawStream, ready_ns: int,
                    prompt: Prompt) -> None:  # fmt: skip
        """Request ``k``, sent from where its last parent's reply ended: counted on a slot
        now (one was free when it left)."""
        node = self.trace.nodes[k]
        await self.host.sem.acquire()
        raw = await self.host.track_turn(
            self.first + k, prompt, node.session, node.turn, stream, ready_ns, ready_ns,
            agent=self.link(k), route=self.routes[node.session],
        )  # fmt: skip
        self.after(k, raw)

    def after(self, k: int, raw: RawStream) -> None:
        """Request ``k``'s stream is over: its children go on from here when its end was
        not seen in a read callback (a body closed by the client after ``[DONE]``)."""
        if not self.handled[k]:
            self.ended(k, raw)

    def ended(self, k: int, raw: RawStream) -> None:
        """Where request ``k``'s response ended (a read callback): its reply decoded
        (``reply_text``); each child it was the last parent of is sent from here when it
        is ready now and a slot is free (no wait for a task to be scheduled), else handed
        to a task that waits for its time or a slot. A failed request sends no child."""
        host = self.host
        self.handled[k] = True
        if host.halted:
            return
        reply = reply_text(raw, host.classifier())
        if reply is None:
            return
        self.replies[k], self.end_ns[k] = reply, raw.wire_end_ns
        for c in self.trace.children[k]:
            self.pending[c] -= 1
            if self.pending[c]:
                continue
            child = self.trace.nodes[c]
            ready = max(self.end_ns[p] for p in child.parents) + child.delay_ns
            if ready > time.monotonic_ns() or host.sem.locked():
                self.start(c, ready)
                continue
            try:
                rid, req = self.prepare(c)
                stream = host.send_turn(rid, req, partial(self.ended, c), self.lane(c))
                prompt = self.sent_prompt(c)  # after the send: off its critical path
            except Exception as e:  # raised by drive_agents
                self.error = self.error or e
                continue
            task = asyncio.create_task(self.track(c, stream, ready, prompt))
            host.tasks.add(task)
            task.add_done_callback(self.done)


async def drive_agents(host: SessionHost, trace: AgentTrace, first_index: int) -> None:
    """Replay ``trace`` from the measured phase's start; returns when every request has
    ended or will not be sent. A bug in a request's task is raised here, after the others
    ended."""
    dag = _Dag(host, trace, first_index)
    start = host.start_ns + host.measure_start_ns
    for k, node in enumerate(trace.nodes):
        if not node.parents:
            dag.start(k, start + trace.session_start_ns[node.session] + node.delay_ns)
    while host.tasks:
        await asyncio.wait(set(host.tasks))
    if dag.error is not None:
        raise dag.error
