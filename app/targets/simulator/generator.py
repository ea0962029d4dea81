"""Token generation and its timing model: ``Gen`` is one request being generated, stepped by
the scheduler when its next event is due. It owns the text (a seeded tape of words,
``build_tape``), the bytes of every SSE chunk and of the whole non-streaming response, the
deadlines (TTFT plus per-input-token prefill, ITL with jitter and a per-active-request
slowdown, ``tokens_per_event`` tokens an event, late events coalesced into one write), the
faults once they strike (disconnect, stall, malformed line), the ground-truth marks of what
it wrote and the server's batch counters (waiting, running, KV tokens, token totals).
"""

from __future__ import annotations

import random
import time
from time import monotonic_ns
from typing import Any, Protocol

from app.client.tokenizer import WORDS
from app.targets.sim_config import Fault, SimConfig
from app.targets.simulator.http import HttpProtocol, json_bytes
from app.targets.simulator.plan import EventStreamShape, Plan, Wire, fault_event, h64
from app.targets.simulator.records import (
    K_CONTENT,
    K_DONE,
    K_FINISH,
    K_MALFORMED,
    K_REASONING,
    K_RESPONSE,
    K_USAGE,
    Record,
)

_TAPE_BITS = 16
_TAPE_MASK = (1 << _TAPE_BITS) - 1
_MALFORMED_PAYLOAD = b'data: {"choices": [{"delta": {"content": "unterminated\n\n'
_MALFORMED_FRAME = b"%x\r\n%b\r\n" % (len(_MALFORMED_PAYLOAD), _MALFORMED_PAYLOAD)
_STOP_FAULTS = (Fault.DISCONNECT, Fault.STALL)
_DONE_PAYLOAD = b"data: [DONE]\n\n"
_WAITING, _RUNNING, _FINISHED = 0, 1, 2


class Batch(Protocol):
    """The server's state a generation reads and counts into (``SimServer``)."""

    config: SimConfig
    tape: list[bytes]
    per_active_ns: int
    waiting: int
    running: int
    kv_tokens: int
    generation_tokens_total: int
    success_total: int

    def count_spec(self, seq: int, output_tokens: int, rec: Record | None) -> None: ...


def build_tape(seed: int) -> list[bytes]:
    """The words every response's text is read from (a request starts at a seeded offset)."""
    rng = random.Random(h64(seed, "tape"))
    words = [(" " + w).encode() for w in WORDS]
    return rng.choices(words, k=1 << _TAPE_BITS)


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class Gen:
    """One request being generated: the scheduler calls ``step`` when its next event is due."""

    __slots__ = (
        "c_prefix",
        "c_rest",
        "cache_on",
        "coalesce",
        "created",
        "events",
        "fault",
        "fault_event",
        "ident",
        "input_tokens",
        "itl_ns",
        "jitter_ns",
        "kr",
        "n",
        "n_events",
        "per_event",
        "plan",
        "pos",
        "proto",
        "r_prefix",
        "rec",
        "rng",
        "sent",
        "seq",
        "shape",
        "srv",
        "state",
        "suffix",
        "switch",
        "tail",
        "tape",
        "text_offset",
    )

    def __init__(
        self,
        srv: Batch,
        proto: HttpProtocol,
        rec: Record | None,
        plan: Plan,
        seq: int,
        fault: Fault,
    ) -> None:
        cfg = srv.config
        self.srv = srv
        self.proto = proto
        self.rec = rec
        self.plan = plan
        self.n = plan.output_tokens
        self.seq = seq
        self.kr = plan.reasoning_tokens
        self.input_tokens = plan.input_tokens
        self.cache_on = cfg.prefix_cache_block > 0
        self.per_event = cfg.tokens_per_event
        self.coalesce = cfg.coalesce_late
        self.sent = 0
        self.n_events = 0
        self.state = _WAITING
        self.fault = fault
        self.fault_event = fault_event(cfg, seq, plan) if fault is not Fault.NONE else -1
        self.itl_ns = round(cfg.itl_ms * 1e6)
        self.jitter_ns = round(cfg.itl_jitter_ms * 1e6)
        self.rng = random.Random(h64(cfg.seed, "jitter", seq)) if self.jitter_ns else None
        self.tape = srv.tape
        self.text_offset = h64(cfg.seed, "text", plan.text_seed) & _TAPE_MASK
        self.pos = self.text_offset
        self.created = cfg.created if cfg.created is not None else int(time.time())
        shape = plan.shape
        assert shape is not None  # a generating surface's plan
        self.shape = shape
        self.ident = f"{shape.ident}-sim-{seq}"
        head = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[{"index":0,' % (
            self.ident.encode(),
            shape.chunk_object,
            self.created,
            json_bytes(plan.model),
        )
        # a shape whose first content event opens differently (a tool call's first delta
        # names its function): that one first, then ``content_open``
        first: bytes | None = getattr(shape, "first_open", None)
        self.c_prefix = head + (first if first is not None else shape.content_open)
        self.c_rest = head + shape.content_open if first is not None else None
        self.r_prefix = head + shape.reasoning_open
        self.suffix = shape.close
        # a stream of typed events (Responses API, Anthropic Messages): the shape's own
        # frames around the deltas, and its events between reasoning and content
        self.events = shape if isinstance(shape, EventStreamShape) else None
        self.switch = b""
        if self.events is not None:
            self.c_prefix, self.r_prefix = self.events.prefixes(self.wire())
            if self.kr:
                self.switch = _frame(self.events.transition(self.wire()))
        self.tail = self._tail()

    # chunk JSON -------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj: dict[str, Any] = {
            "id": self.ident,
            "object": self.shape.chunk_object.decode(),
            "created": self.created,
            "model": self.plan.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + json_bytes(obj) + b"\n\n"

    def wire(self) -> Wire:
        """What an event shape writes around the deltas (``EventStreamShape``)."""
        off = self.text_offset
        return Wire(
            self.ident,
            self.created,
            self.plan.model,
            self.input_tokens,
            self.plan.cached_tokens if self.cache_on else None,
            self.n,
            self.kr,
            self.plan.finish_reason,
            self._text(off, self.kr),
            self._text(off + self.kr, self.n - self.kr),
        )

    def role_chunk(self) -> bytes:
        if self.events is not None:
            return _frame(self.events.opening(self.wire()))
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": None},
            "finish_reason": None,
        }
        return _frame(self._chunk([choice]))

    def usage(self) -> dict[str, Any]:
        u: dict[str, Any] = {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.n,
            "total_tokens": self.input_tokens + self.n,
        }
        if self.kr:
            u["completion_tokens_details"] = {"reasoning_tokens": self.kr}
        if self.cache_on:
            u["prompt_tokens_details"] = {"cached_tokens": self.plan.cached_tokens}
        return u

    def _tail(self) -> bytes:
        plan = self.plan
        if self.events is not None:
            return _frame(self.events.closing(self.wire())) + b"0\r\n\r\n"
        out = _frame(self._chunk([self.shape.finish_choice(plan.finish_reason)]))
        if plan.include_usage:
            out += _frame(self._chunk([], usage=self.usage()))
        return out + _frame(_DONE_PAYLOAD) + b"0\r\n\r\n"

    def _text(self, start: int, count: int) -> str:
        tape = self.tape
        return b"".join(tape[(start + i) & _TAPE_MASK] for i in range(count)).decode()

    def full_response(self) -> bytes:
        plan = self.plan
        if self.events is not None:
            return self.events.whole(self.wire())
        off = self.text_offset
        reasoning = self._text(off, self.kr)
        content = self._text(off + self.kr, self.n - self.kr)
        choice = self.shape.whole_choice(content, reasoning, plan.finish_reason)
        return json_bytes(
            {
                "id": self.ident,
                "object": self.shape.answer_object,
                "created": self.created,
                "model": plan.model,
                "choices": [choice],
                "usage": self.usage(),
            }
        )

    # timing -------------------------------------------------------------------
    def next_size(self) -> int:
        sent, kr = self.sent, self.kr
        if sent < kr:
            return min(self.per_event, kr - sent)
        return min(self.per_event, self.n - sent)

    def gap(self, count: int) -> int:
        """Nanoseconds that ``count`` more tokens take to generate."""
        if count <= 0:
            return 0
        srv = self.srv
        base = self.itl_ns + srv.per_active_ns * (srv.waiting + srv.running)
        j = self.jitter_ns
        if j == 0:
            return count * base
        assert self.rng is not None
        uniform = self.rng.uniform
        return sum(max(0, base + round(uniform(-j, j))) for _ in range(count))

    def first_due(self, received_ns: int) -> int:
        cfg = self.srv.config
        uncached = self.input_tokens - self.plan.cached_tokens
        ttft = round((cfg.ttft_ms + cfg.per_input_token_ms * uncached) * 1e6)
        last = self.n if not self.plan.stream else self.next_size()
        return received_ns + ttft + self.gap(last - 1)

    # the hot path ---------------------------------------------------------------
    def step(self, due: int, now: int) -> int | None:
        """Write the event due at ``due`` (and, when late, the ones due by ``now`` with it).

        Returns the next deadline, or None when this request leaves the scheduler.
        """
        if self.state == _FINISHED:
            return None
        proto = self.proto
        if proto.closed:
            self.release()
            return None
        fault_now = self.n_events == self.fault_event
        if fault_now and self.fault in _STOP_FAULTS:
            self._stop(self.fault is Fault.DISCONNECT)
            return None
        if not self.plan.stream:
            self._respond_whole(due, fault_now)
            return None
        data, marks, nxt = self._build(due, now)
        t = monotonic_ns()
        transport = proto.transport
        assert transport is not None
        transport.write(data)
        rec = self.rec
        if rec is not None and rec.first_content_written_ns is None and K_CONTENT in marks[1::3]:
            rec.first_content_written_ns = monotonic_ns()  # the send (TLS: encrypted) is done
            sock = proto.stamp_socket
            if sock is not None and t <= sock.send_ns <= rec.first_content_written_ns:
                rec.first_content_send_ns = sock.send_ns  # the send syscall itself began
        if self.state == _WAITING:
            self.state = _RUNNING
            self.srv.waiting -= 1
            self.srv.running += 1
        if self.rec is not None:
            self.rec.add_marks(t, marks)
        if nxt is None:
            self.release()
            self.srv.success_total += 1
            self.srv.count_spec(self.seq, self.n, self.rec)
            proto.response_done()
        return nxt

    def _build(self, due: int, now: int) -> tuple[bytes, list[int], int | None]:
        """Bytes of the event due at ``due`` (plus any later ones already due when catching
        up), their ground-truth marks ``[due, kind, tokens, ...]`` and the next deadline."""
        parts: list[bytes] = []
        marks: list[int] = []
        tape, suffix, srv = self.tape, self.suffix, self.srv
        while True:
            if self.n_events == self.fault_event and self.fault is Fault.MALFORMED:
                parts.append(_MALFORMED_FRAME)
                marks += (due, K_MALFORMED, 0)
            sent = self.sent
            if self.switch and sent == self.kr:
                parts.append(self.switch)
            if sent < self.kr:
                count = min(self.per_event, self.kr - sent)
                prefix, kind = self.r_prefix, K_REASONING
            else:
                count = min(self.per_event, self.n - sent)
                prefix, kind = self.c_prefix, K_CONTENT
                if self.c_rest is not None:
                    self.c_prefix, self.c_rest = self.c_rest, None
            pos = self.pos
            if count == 1:
                text = tape[pos & _TAPE_MASK]
            else:
                text = b"".join([tape[(pos + i) & _TAPE_MASK] for i in range(count)])
            self.pos = pos + count
            payload = prefix + text + suffix
            parts.append(b"%x\r\n%b\r\n" % (len(payload), payload))
            marks += (due, kind, count)
            self.sent = sent = sent + count
            self.n_events += 1
            srv.generation_tokens_total += count
            srv.kv_tokens += count
            if sent >= self.n:
                parts.append(self.tail)
                marks += self.tail_marks(due)
                return b"".join(parts), marks, None
            nxt = due + self.gap(self.next_size())
            if nxt > now or not self.coalesce or self.n_events == self.fault_event:
                return (parts[0] if len(parts) == 1 else b"".join(parts)), marks, nxt
            due = nxt

    def tail_marks(self, due: int) -> list[int]:
        marks = [due, K_FINISH, 0]
        if self.plan.include_usage:
            marks += (due, K_USAGE, 0)
        return [*marks, due, K_DONE, 0]

    def _respond_whole(self, due: int, malformed: bool) -> None:
        body = b'{"id": "not json' if malformed else self.full_response()
        t = self.proto.send_simple(200, body)
        self.srv.generation_tokens_total += self.n
        if self.rec is not None:
            self.rec.status = 200
            self.rec.headers_ns = t
            self.rec.add(t, due, K_MALFORMED if malformed else K_RESPONSE, self.n)
        self.release()
        self.srv.success_total += 1
        self.srv.count_spec(self.seq, self.n, self.rec)

    def _stop(self, abort: bool) -> None:
        t = monotonic_ns()
        if abort:
            self.proto.abort()
        if self.rec is not None:
            self.rec.fault_ns = t
            self.rec.fault_after_tokens = self.sent
        self.release()

    def release(self) -> None:
        """Leave the batch (idempotent): finished, faulted or the client went away."""
        srv = self.srv
        if self.state == _WAITING:
            srv.waiting -= 1
        elif self.state == _RUNNING:
            srv.running -= 1
        else:
            return
        self.state = _FINISHED
        srv.kv_tokens -= self.input_tokens + self.sent
