"""Multi-turn sessions (``RunSpec.multi_turn``): each session replays one conversation's
human turns in order, on the runner's event loop.

* Turn k+1 carries the whole history: the session's system messages, every earlier human
  turn and, after each, the assistant reply **as the server streamed it** (the content
  events' text, reasoning left out), never the dataset's reply.
* It is due when turn k's stream ended (``RawStream.end_ns``) plus ``turn_delay_ms``; the
  runner's send lag then measures how late each next turn left against that.
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
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from app.client.datasets import dataset_type, parse_options
from app.client.datasets.base import AnyTokenizer, BuildContext, Prompt, Workload
from app.client.datasets.conversations import Conversation, Sessions, build_sessions
from app.client.events import Classifier
from app.client.http_stream import RawStream, Target, build_request, request_body, request_headers
from app.client.spec import RunSpec
from app.domain import TOKEN_KINDS, EventKind, RequestStatus

BURST_STARTS = 4  # session starts between two I/O rounds during a burst (as the runner's)

__all__ = ["Sessions", "build_session_workload", "drive_sessions", "reply_text"]


class SessionHost(Protocol):
    """What sessions use of the runner's state (``app.client.runner._Run``)."""

    spec: RunSpec
    run_tag: str
    target: Target
    path: str
    tok: AnyTokenizer
    start_ns: int
    measure_start_ns: int
    halted: str | None
    halted_event: asyncio.Event
    sem: asyncio.Semaphore
    slots: int
    tasks: set[asyncio.Task[Any]]

    async def sleep_until(self, t_ns: int) -> None: ...

    async def send_turn(
        self,
        index: int,
        prompt: Prompt,
        session: int,
        turn: int,
        rid: str,
        req: bytes,
        due_ns: int,
        fresh_slot: bool,
    ) -> RawStream: ...


def build_session_workload(
    spec: RunSpec,
    tok: AnyTokenizer,
    dataset_dirs: Sequence[str] | None,
    cancelled: Callable[[], bool] | None,
) -> Sessions:
    kind = dataset_type(spec.dataset)
    options = parse_options(kind, spec.dataset_options)
    ctx = BuildContext(tok, dataset_dirs, cancelled)
    return build_sessions(spec.dataset, spec.workload_params(), options, ctx, spec.max_turns)


def _first_turn(conv: Conversation, tok: AnyTokenizer) -> Prompt:
    msgs = [*conv.system, {"role": "user", "content": conv.turns[0].text}]
    return Prompt(None, msgs, sum(tok.count(m["content"]) for m in msgs), conv.turns[0].output_len)


def warmup_workload(sessions: Sessions, tok: AnyTokenizer) -> Workload:
    """The warm-ups (first turns, single requests); the measured requests are the sessions'."""
    return Workload([_first_turn(c, tok) for c in sessions.warmup], [], sessions.source)


def reply_text(raw: RawStream) -> str | None:
    """The reply the server streamed (content events' text), or None when the turn failed
    by the record's rules (``app.client.records``): not OK, an error event, no token."""
    for _ in raw.finalize_steps():
        pass
    if raw.status is not RequestStatus.OK:
        return None
    classify = Classifier().classify
    parts: list[str] = []
    tokens = 0
    for data in raw.ev_data:
        kind, text, _usage, error = classify(data)
        if error is not None:
            return None
        if kind in TOKEN_KINDS:
            tokens += 1
            if kind is EventKind.CONTENT:
                parts.append(text)
    return "".join(parts) if tokens else None


async def drive_sessions(
    host: SessionHost, sessions: Sessions, times_ns: list[int], first_index: int
) -> None:
    """Run the measured sessions: session i starts at ``times_ns[i]`` (after the measured
    phase's start) once an active-session slot is free; returns when all have ended."""
    measured = sessions.measured
    active = asyncio.Semaphore(host.slots)
    released: deque[int] = deque()  # when each session slot was given back (FIFO)
    index = itertools.count(first_index)
    taken = 0
    burst = 0
    start = host.start_ns + host.measure_start_ns
    for s, (conv, t) in enumerate(zip(measured, times_ns, strict=False)):
        if host.halted:
            break
        scheduled = start + int(t)
        if scheduled > time.monotonic_ns():
            await host.sleep_until(scheduled)
            burst = 0
        if host.halted:
            break
        await active.acquire()
        if host.halted:
            active.release()
            break
        fresh = taken < host.slots
        if fresh:
            taken += 1
            due = scheduled
        else:
            due = max(scheduled, released.popleft())
        task = asyncio.create_task(_session(host, s, conv, due, fresh, index, active, released))
        host.tasks.add(task)
        task.add_done_callback(host.tasks.discard)
        burst += 1
        if burst >= BURST_STARTS:
            await asyncio.sleep(0)
            burst = 0
    while host.tasks:
        await asyncio.wait(set(host.tasks))


async def _session(
    host: SessionHost,
    s: int,
    conv: Conversation,
    due_ns: int,
    fresh: bool,
    index: Iterator[int],
    active: asyncio.Semaphore,
    released: deque[int],
) -> None:
    spec = host.spec
    tok = host.tok
    think_ns = int(spec.turn_delay_ms * 1e6)
    keep_alive = spec.connection_mode == "keep-alive"
    history: list[dict[str, Any]] = list(conv.system)
    history_tokens = sum(tok.count(m["content"]) for m in history)
    try:
        for k, turn in enumerate(conv.turns, start=1):
            if host.halted:
                return
            delay = (due_ns - time.monotonic_ns()) / 1e9
            if delay > 0:  # think time, cut short when the run is stopped
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(host.halted_event.wait(), delay)
                if host.halted:
                    return
            user = {"role": "user", "content": turn.text}
            user_tokens = tok.count(turn.text)
            messages = [*history, user]
            body = request_body(
                endpoint="chat",
                model=spec.model,
                prompt=None,
                messages=messages,
                output_len=turn.output_len,
                ignore_eos=spec.ignore_eos,
                extra_body=spec.extra_body,
            )
            rid = f"{host.run_tag}-s{s}-t{k}"
            headers = request_headers(host.target, rid, spec.api_key, keep_alive=keep_alive)
            req = build_request(host.path, headers, body)
            prompt = Prompt(None, messages, history_tokens + user_tokens, turn.output_len)
            await host.sem.acquire()  # never waits: active sessions <= slots
            raw = await host.send_turn(next(index), prompt, s, k, rid, req, due_ns, fresh)
            fresh = False
            reply = reply_text(raw)
            if reply is None:
                return  # the failed turn's record carries the error; the session ends
            due_ns = raw.end_ns + think_ns
            history = [*messages, {"role": "assistant", "content": reply}]
            history_tokens += user_tokens + tok.count(reply)
    finally:
        released.append(time.monotonic_ns())
        active.release()
