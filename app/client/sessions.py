"""Multi-turn sessions (``RunSpec.multi_turn``): each session replays one conversation's
human turns in order, on the runner's event loop.

* Turn k+1 carries the whole history: the session's system messages, every earlier human
  turn and, after each, the assistant reply **as the server streamed it** (the content
  events' text, reasoning left out), never the dataset's reply.
* It is due when turn k's response ended on the wire (``RawStream.wire_end_ns``) plus
  ``turn_delay_ms``; the runner's send lag then measures how late each next turn left
  against that. A session's first turn is due at the session's arrival; its wait for a
  session slot is its queue wait.
* ``max_concurrency`` counts active sessions: a session holds its slot from its first turn
  to its last; sessions start on the run's load shape (one arrival per session).
* A turn that fails (HTTP error, broken stream, an error event, no token) ends its session,
  the error in that turn's record; the other sessions go on.
* ``X-Request-Id`` is ``<run_tag>-s<session>-t<turn>`` (session 0-based, turn 1-based);
  records carry ``session`` and ``turn`` and are indexed in send order after the warm-ups.

Warm-ups are single requests: the first turn of ``warmup_requests`` conversations.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.client.datasets import dataset_type, parse_options
from app.client.datasets.base import AnyTokenizer, BuildContext, Prompt, Workload
from app.client.datasets.conversations import Conversation, Sessions, Turn, build_sessions
from app.client.endpoints.base import ClassifyFn
from app.client.http_request import finish_request
from app.client.http_stream import StreamRequest
from app.client.raw_stream import RawStream
from app.client.routing import Route
from app.client.spec import RunSpec
from app.domain import TOKEN_KINDS, AgentLink, EventKind, RequestStatus

BURST_STARTS = 4  # session starts between two I/O rounds during a burst (as the runner's)
# turns one session sends at most, ``max_turns`` or not (``RunSpec.max_turns``'s own maximum):
# the server bounds a multi-turn run's request indices by sessions x this
MAX_SESSION_TURNS = 10_000

__all__ = [
    "MAX_SESSION_TURNS",
    "Sessions",
    "build_session_workload",
    "drive_sessions",
    "reply_text",
]


class SessionHost(Protocol):
    """What sessions use of the runner's state (``app.client.load_run.LoadRun``)."""

    spec: RunSpec
    run_tag: str
    tok: AnyTokenizer
    start_ns: int
    measure_start_ns: int
    halted: str | None
    sem: asyncio.Semaphore
    slots: int
    tasks: set[asyncio.Task[Any]]

    async def wait_until(
        self, t_ns: int, on_spin: Callable[[], None] | None = None, *, hold: bool = False
    ) -> None: ...

    def send_turn(
        self,
        rid: str,
        req: bytes,
        on_end: Callable[[RawStream], None] | None = None,
        lane: int = 0,
    ) -> StreamRequest | RawStream: ...

    def head(self, rid: str, route: Route) -> bytes: ...

    def session_route(self, s: int) -> Route: ...

    def route_spec(self, route: Route) -> RunSpec: ...

    def classifier(self) -> ClassifyFn: ...

    def open_ahead(self, lane: int, n: int) -> None: ...

    def track_turn(
        self,
        index: int,
        prompt: Prompt,
        session: int,
        turn: int,
        stream: StreamRequest | RawStream,
        due_ns: int,
        scheduled_ns: int,
        *,
        agent: AgentLink | None = None,
        route: Route | None = None,
    ) -> Coroutine[Any, Any, RawStream]: ...


def build_session_workload(
    spec: RunSpec,
    tok: AnyTokenizer,
    dataset_dirs: Sequence[str] | None,
    cancelled: Callable[[], bool] | None,
) -> Sessions:
    kind = dataset_type(spec.dataset)
    options = parse_options(kind, spec.dataset_options)
    ctx = BuildContext(tok, dataset_dirs, cancelled)
    turns = spec.max_turns or MAX_SESSION_TURNS
    return build_sessions(spec.dataset, spec.workload_params(), options, ctx, turns)


def _first_turn(conv: Conversation, tok: AnyTokenizer) -> Prompt:
    msgs = [*conv.system, {"role": "user", "content": conv.turns[0].text}]
    return Prompt(None, msgs, sum(tok.count(m["content"]) for m in msgs), conv.turns[0].output_len)


def warmup_workload(sessions: Sessions, tok: AnyTokenizer) -> Workload:
    """The warm-ups (first turns, single requests); the measured requests are the sessions'."""
    return Workload([_first_turn(c, tok) for c in sessions.warmup], [], sessions.source)


def reply_text(raw: RawStream, classify: ClassifyFn) -> str | None:
    """The reply the server streamed (content events' text), or None when the turn failed
    by the record's rules (``app.client.records``): not OK, an error event, no token. The
    stream is decoded here (``RawStream.finalize``, idempotent: the one decoder; a turn's
    stream was decoded as it arrived, ``RawStream.advance``, so only its tail is left) and
    its events' classification left in ``raw.ev_classified`` for its record."""
    raw.finalize()
    if raw.status is not RequestStatus.OK:
        return None
    data = raw.ev_data
    classified = (raw.ev_classified or [])[: len(data)]  # those decoded as they arrived
    if raw.eager is not None:
        classify = raw.eager.classify
    classified += [classify(d) for d in data[len(classified) :]]
    raw.ev_classified = classified
    parts: list[str] = []
    tokens = 0
    for kind, text, _usage, error, _items in classified:
        if error is not None:
            return None
        if kind in TOKEN_KINDS:
            tokens += 1
            if kind is EventKind.CONTENT:
                parts.append(text)
    return "".join(parts) if tokens else None


async def drive_sessions(
    host: SessionHost,
    sessions: Sessions,
    times_ns: list[int],
    first_index: int,
    session_ids: list[int] | None = None,
) -> None:
    """Run the measured sessions: session i starts at ``times_ns[i]`` (after the measured
    phase's start) once an active-session slot is free; returns when all have ended.
    ``session_ids``: the sessions' numbers (a dealt run's share: their global ones)."""
    measured = sessions.measured
    active = asyncio.Semaphore(host.slots)
    released: deque[int] = deque()  # when each session slot was given back (FIFO)
    index = itertools.count(first_index)
    taken = 0
    burst = 0
    start = host.start_ns + host.measure_start_ns
    for k, (conv, t) in enumerate(zip(measured, times_ns, strict=False)):
        s = session_ids[k] if session_ids is not None else k
        if host.halted:
            break
        scheduled = start + int(t)
        if scheduled > time.monotonic_ns():
            await host.wait_until(scheduled)
            burst = 0
        if host.halted:
            break
        await active.acquire()
        if host.halted:
            active.release()
            break
        if taken < host.slots:
            taken += 1
            due = scheduled
        else:
            due = max(scheduled, released.popleft())
        task = asyncio.create_task(_session(host, s, conv, scheduled, due, index, active, released))
        host.tasks.add(task)
        task.add_done_callback(host.tasks.discard)
        burst += 1
        if burst >= BURST_STARTS:
            await asyncio.sleep(0)
            burst = 0
    while host.tasks:
        await asyncio.wait(set(host.tasks))


@dataclass(frozen=True, slots=True)
class BodyTemplate:
    """A turn's request body around its messages: ``head`` + the messages' JSON, joined by
    commas + ``tail`` is ``request_body``'s bytes for those messages."""

    head: bytes
    tail: bytes

    def body(self, messages_json: bytes) -> bytes:
        return self.head + messages_json + self.tail


def dumps(obj: object) -> bytes:
    """JSON as ``request_body`` writes it (compact separators, ASCII escapes)."""
    return json.dumps(obj, separators=(",", ":")).encode()


_MARK = "\x00tokentrace-history\x00"


def turn_body(spec: RunSpec, messages: list[Any], output_len: int) -> bytes:
    """The body of a turn: the run's surface's body for these messages."""
    kind, options = spec.surface()
    return kind.body(Prompt(None, messages, 0, output_len), spec.body_params(), options)


def body_template(spec: RunSpec, output_len: int) -> BodyTemplate | None:
    """The template of a turn asking ``output_len`` tokens, from ``turn_body`` itself (with
    a one-message marker list); None when the marker does not show exactly once
    (``extra_body`` replacing ``messages``), or for a surface that moves messages out of the
    list (``system_apart``: Anthropic's top-level ``system``): such turns are serialised
    whole."""
    if getattr(spec.surface()[0], "system_apart", False):
        return None
    full = turn_body(spec, [_MARK], output_len)
    mark = b"[" + dumps(_MARK) + b"]"
    i = full.find(mark)
    if i < 0 or full.find(mark, i + 1) >= 0:
        return None
    return BodyTemplate(full[: i + 1], full[i + len(mark) - 1 :])


@dataclass(frozen=True, slots=True)
class _NextTurn:
    """A turn, ready but for the reply before it: built while that reply streams."""

    k: int  # 1-based
    turn: Turn
    user: dict[str, Any]
    user_json: bytes
    user_tokens: int
    rid: str
    head: bytes  # request line and headers (``request_head``)
    template: BodyTemplate | None


def _prepare(host: SessionHost, s: int, k: int, turn: Turn, route: Route) -> _NextTurn:
    spec = host.route_spec(route)
    rid = f"{host.run_tag}-s{s}-t{k}"
    user = {"role": "user", "content": turn.text}
    return _NextTurn(
        k,
        turn,
        user,
        dumps(user),
        host.tok.count(turn.text),
        rid,
        host.head(rid, route),
        body_template(spec, turn.output_len),
    )


class History:
    """A session's messages so far, each serialised once (``json``: their JSON joined by
    commas, the inside of the body's ``messages`` list), and their token count."""

    __slots__ = ("json", "messages", "tokens")

    def __init__(self, system: Sequence[dict[str, Any]], tok: AnyTokenizer) -> None:
        self.messages: list[dict[str, Any]] = list(system)
        self.json = b",".join(dumps(m) for m in system)
        self.tokens = sum(tok.count(m["content"]) for m in system)

    def add(self, message: dict[str, Any], message_json: bytes, tokens: int) -> None:
        self.messages.append(message)
        self.json = self.json + b"," + message_json if self.json else message_json
        self.tokens += tokens

    def body(self, spec: RunSpec, nxt: _NextTurn) -> bytes:
        """The body of turn ``nxt``: these messages, then its own."""
        if nxt.template is None:
            return turn_body(spec, [*self.messages, nxt.user], nxt.turn.output_len)
        inner = self.json + b"," + nxt.user_json if self.json else nxt.user_json
        return nxt.template.body(inner)


@dataclass(frozen=True, slots=True)
class _Sent:
    """A turn on its way: what its record and the rest of the session need of it."""

    index: int
    k: int  # 1-based
    prompt: Prompt
    replied: bool  # its reply goes into the next turn (False for the last turn)
    stream: StreamRequest | RawStream
    due_ns: int


class _Chain:
    """One session's conversation state: its history, the next turn (prepared while the
    reply before it streams) and, without think time, that turn sent from the callback
    where the reply ended (``early``): no wait for the session's task to be scheduled
    behind the rest of the loop's round of reads (~0.2 ms, ~0.8 ms at p99 with 256
    sessions streaming)."""

    __slots__ = ("early", "error", "history", "host", "index", "nxt", "route", "s", "spec", "turns")

    def __init__(self, host: SessionHost, s: int, conv: Conversation, index: Iterator[int]) -> None:
        self.host = host
        self.s = s
        self.index = index
        self.turns = conv.turns
        self.history = History(conv.system, host.tok)
        self.route = host.session_route(s)  # one model and one target for the session
        self.spec = host.route_spec(self.route)
        self.nxt: _NextTurn | None = _prepare(host, s, 1, conv.turns[0], self.route)
        self.early: _Sent | None = None
        self.error: Exception | None = None

    def send(self, due_ns: int) -> _Sent:
        """Send the next turn now (``host.send_turn``: no await)."""
        host = self.host
        nxt = self.nxt
        assert nxt is not None
        history = self.history
        req = finish_request(nxt.head, history.body(self.spec, nxt))
        prompt = Prompt(
            None,
            [*history.messages, nxt.user],
            history.tokens + nxt.user_tokens,
            nxt.turn.output_len,
        )
        replied = nxt.k < len(self.turns)
        early = replied and host.spec.turn_delay_ms <= 0
        stream = host.send_turn(nxt.rid, req, self._ended if early else None, self.route.lane)
        return _Sent(next(self.index), nxt.k, prompt, replied, stream, due_ns)

    def advance(self) -> None:
        """The turn just sent joins the history; prepare the one after it."""
        nxt = self.nxt
        assert nxt is not None
        self.history.add(nxt.user, nxt.user_json, nxt.user_tokens)
        k = nxt.k
        turns = self.turns
        nxt = _prepare(self.host, self.s, k + 1, turns[k], self.route) if k < len(turns) else None
        self.nxt = nxt

    def add_reply(self, reply: str) -> None:
        message = {"role": "assistant", "content": reply}
        self.history.add(message, dumps(message), self.host.tok.count(reply))

    def _ended(self, raw: RawStream) -> None:
        """Where the reply ended (a read callback): decode it (``reply_text``) and send the
        next turn from here; a failed turn is left to the task (its session ends)."""
        if self.nxt is None or self.host.halted:
            return
        reply = reply_text(raw, self.host.classifier())
        if reply is None:
            return
        try:
            self.add_reply(reply)
            self.early = self.send(raw.wire_end_ns)
        except Exception as e:  # raised again in the session's task
            self.error = e


async def _session(
    host: SessionHost,
    s: int,
    conv: Conversation,
    scheduled_ns: int,
    due_ns: int,
    index: Iterator[int],
    active: asyncio.Semaphore,
    released: deque[int],
) -> None:
    think_ns = int(host.spec.turn_delay_ms * 1e6)
    chain = _Chain(host, s, conv, index)
    try:
        while chain.nxt is not None:
            sent, chain.early = chain.early, None
            if sent is None:
                if host.halted:
                    return
                if due_ns > time.monotonic_ns():  # think time, cut short when the run halts
                    await host.wait_until(due_ns, hold=True)  # post-processing paused last
                    if host.halted:
                        return
                await host.sem.acquire()  # never waits: active sessions <= slots
                try:
                    sent = chain.send(due_ns)
                except BaseException:
                    host.sem.release()
                    raise
            else:  # sent from the end of the reply before it: counted on a slot now
                await host.sem.acquire()
            pending = host.track_turn(
                sent.index, sent.prompt, s, sent.k, sent.stream, sent.due_ns,
                scheduled_ns if sent.k == 1 else sent.due_ns, route=chain.route,
            )  # fmt: skip
            try:  # while the reply streams: the next turn, all but the reply before it
                chain.advance()
            finally:
                raw = await pending
            if chain.error is not None:
                raise chain.error
            if not sent.replied or chain.nxt is None or chain.early is not None:
                continue  # done, or the next turn already left from where this reply ended
            reply = reply_text(raw, host.classifier())
            if reply is None:
                return  # the failed turn's record carries the error; the session ends
            due_ns = raw.wire_end_ns + think_ns
            chain.add_reply(reply)
    finally:
        released.append(time.monotonic_ns())
        active.release()
