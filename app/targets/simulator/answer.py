"""One whole answer of a surface that does not generate tokens (embeddings, rerank):
``Answer`` is stepped by the scheduler once, when the answer is due (``ttft_ms`` plus
``per_input_token_ms`` for each input token, from the request's receipt), and writes the
bytes its plan holds (built by the surface's handler) as one response. Faults: a disconnect
resets the connection, a stall never answers (the connection stays open), a malformed
answer is a body that is not JSON. Ground truth: one ``response`` event stamped right
before the write, carrying the answer's items (inputs or documents), and the send syscall's
own stamp as the answer's send (``first_content_send_ns``) when the socket gives it."""

from __future__ import annotations

from time import monotonic_ns
from typing import Protocol

from app.targets.sim_config import Fault, SimConfig
from app.targets.simulator.http import HttpProtocol
from app.targets.simulator.plan import Plan
from app.targets.simulator.records import K_MALFORMED, K_RESPONSE, Record

_MALFORMED = b'{"object": "not json'


class Batch(Protocol):
    """The server's counters an answer counts into (``SimServer``)."""

    config: SimConfig
    waiting: int
    kv_tokens: int
    success_total: int


class Answer:
    """One whole answer, written when due."""

    __slots__ = ("done", "fault", "plan", "proto", "rec", "srv")

    def __init__(
        self, srv: Batch, proto: HttpProtocol, rec: Record | None, plan: Plan, fault: Fault
    ) -> None:
        self.srv = srv
        self.proto = proto
        self.rec = rec
        self.plan = plan
        self.fault = fault
        self.done = False

    def first_due(self, received_ns: int) -> int:
        cfg = self.srv.config
        return received_ns + round(
            (cfg.ttft_ms + cfg.per_input_token_ms * self.plan.input_tokens) * 1e6
        )

    def step(self, due: int, now: int) -> int | None:
        if self.done:
            return None
        proto = self.proto
        if proto.closed:
            self.release()
            return None
        if self.fault in (Fault.DISCONNECT, Fault.STALL):
            if self.fault is Fault.DISCONNECT:
                proto.abort()
            if self.rec is not None:
                self.rec.fault_ns = monotonic_ns()
                self.rec.fault_after_tokens = 0
            self.release()
            return None
        malformed = self.fault is Fault.MALFORMED
        answer = self.plan.answer if not malformed and self.plan.answer is not None else _MALFORMED
        sock = proto.stamp_socket
        t = proto.send_simple(200, answer)
        rec = self.rec
        if rec is not None:
            rec.first_content_written_ns = monotonic_ns()
            if sock is not None and t <= sock.send_ns <= rec.first_content_written_ns:
                rec.first_content_send_ns = sock.send_ns
            rec.status = 200
            rec.headers_ns = t
            rec.add(t, due, K_MALFORMED if malformed else K_RESPONSE, self.plan.items)
        self.release()
        self.srv.success_total += 1
        return None

    def release(self) -> None:
        """Leave the batch (idempotent): answered, faulted or the client went away."""
        if self.done:
            return
        self.done = True
        self.srv.waiting -= 1
        self.srv.kv_tokens -= self.plan.input_tokens
