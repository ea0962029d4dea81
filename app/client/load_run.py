"""The state of one load run on its event loop (``LoadRun``, one per ``run_load`` call,
``app.client.runner``): its slots and connections, the requests it dispatches on their
schedule (``dispatch``, ``wait_until``), the turns sessions and agent traces send through it
(``send_turn``, ``track_turn``), the post-processing of finished streams into records
between I/O rounds, and the monitor of its own health (loop lag, CPU wait, clock drift,
progress). ``app.client.run_result`` assembles its ``LoadResult``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from app.client.clocks import ClockMap
from app.client.connpool import ConnPool, raise_nofile_limit
from app.client.datasets.base import Prompt
from app.client.endpoints.base import ClassifyFn, surface_headers
from app.client.eventloop import stamping_selector
from app.client.http_request import Target, finish_request
from app.client.http_stream import StreamRequest
from app.client.lanes import build_lanes, route_head, router_of
from app.client.limits import BufferBudget
from app.client.load_result import Progress
from app.client.preconnect import Opener
from app.client.raw_stream import RawStream
from app.client.records import record_steps
from app.client.routing import NO_ROUTE, Route
from app.client.run_result import MONITOR_PERIOD_S
from app.client.sched import NORMAL, CpuWait, Scheduling
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer
from app.domain import AgentLink, ClockSource, RequestRecord, RequestStatus

SPIN_NS = 1_200_000  # ``wait_until``: the last stretch of a wait, in zero-timeout loop rounds
HOLD_BACKLOG_MAX = 64  # streams waiting for post-processing beyond which it never pauses
POSTPROCESS_SLICE_NS = 100_000  # post-processing work between two I/O rounds (~1-2 pieces)
BURST_STARTS = 4  # request starts between two I/O rounds during a burst
CLOCK_RESAMPLE_S = 1.0
PROGRESS_PERIOD_S = 0.5


FD_RESERVE = 64  # descriptors kept for everything but the run's connections


def connection_budget(wanted: int) -> int:
    """How many connections a run may hold open: ``wanted``, within the descriptors the
    process may open (the soft limit is raised to the hard one first), keeping
    ``FD_RESERVE`` for everything else."""
    soft = raise_nofile_limit()
    if soft is None:
        return max(1, wanted)
    return max(1, min(wanted, soft - FD_RESERVE))


@dataclass(frozen=True, slots=True)
class Timing:
    due_ns: int  # when the request could start: scheduled, or when its slot was free
    scheduled_ns: int  # when the load shape scheduled it (absolute)


@dataclass(slots=True)
class Item:
    index: int
    prompt: Prompt
    warmup: bool
    scheduled_ns: int  # run-relative
    session: int | None = None  # multi-turn sessions (app.client.sessions)
    turn: int | None = None
    agent: AgentLink | None = None  # an agent trace's request (app.client.agent_sessions)
    route: Route = NO_ROUTE  # its model and target (app.client.routing)


class LoadRun:
    """Mutable state of one run (one instance per ``run_load`` call)."""

    def __init__(
        self,
        spec: RunSpec,
        run_tag: str,
        tok: BuiltinTokenizer | HFTokenizer,
        target: Target,
        on_progress: Callable[[Progress], None] | None,
        stop: asyncio.Event | None,
        kernel_stamps: bool,
    ) -> None:
        self.spec = spec
        self.run_tag = run_tag
        self.tok = tok
        self.target = target
        self.endpoint, self.endpoint_options = spec.surface()
        self.lanes = build_lanes(spec, self.endpoint.path(self.endpoint_options))
        self.router = router_of(spec, run_tag)
        self.own_headers, self.key_header = surface_headers(self.endpoint, self.endpoint_options)
        # a session's spec per model (its bodies read spec.body_params())
        self.model_specs = [spec.model_copy(update={"model": m}) for m in self.router.models]
        self.on_progress = on_progress
        self.stop = stop
        self.on_record: Callable[[RequestRecord], None] | None = None
        self.kernel_stamps = kernel_stamps
        self.clock = ClockMap()
        self.start_ns = time.monotonic_ns()
        self.start_wall = datetime.now(UTC)
        self.deadline_ns = (
            self.start_ns + int(spec.max_duration_s * 1e9) if spec.max_duration_s else None
        )
        # one slot per connection the run may hold open: the concurrency, or (rate-driven
        # runs) what the descriptor budget allows
        self.capped = spec.max_concurrency is not None
        self.planned = spec.prompts  # measured requests planned (sessions: their turns)
        wanted = spec.max_concurrency or max(spec.prompts, spec.warmup_requests)
        self.slots = connection_budget(wanted)
        self.fd_capped = self.capped and self.slots < wanted
        self.sem = asyncio.Semaphore(self.slots)
        self.slots_taken = 0  # slots handed out that no earlier request of the phase used
        self.release_times: deque[int] = deque()  # when each slot was given back (FIFO)
        self.pool_waits = 0  # measured requests of a rate-driven run that waited for a slot
        self.pool = ConnPool(keep_alive=spec.connection_mode == "keep-alive", bound=self.slots)
        self.budget = BufferBudget(spec.limits.max_buffered_bytes)  # every capture counts in it
        self.opener = Opener(
            self.pool, kernel_stamps=kernel_stamps, timeout_s=spec.request_timeout_s
        )  # connections opened ahead (``open_ahead``)
        self.records: list[RequestRecord] = []
        self.active: set[StreamRequest] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.halted: str | None = None
        self.sleepers: set[asyncio.Future[None]] = set()  # ``wait_until``s: ``halt`` wakes them
        self.holding = 0  # waits in their last stretch that asked post-processing to pause
        self.phase = "warmup"
        self.body_params = [s.body_params() for s in self.model_specs]  # per model
        self.measure_start_ns = 0
        self.sent_measured = 0
        self.sent_total = 0
        self.send_times: list[int] = []
        self.loop_lag: list[int] = []
        self.cpu_wait = CpuWait()  # opened on the loop's thread: it measures that thread
        self.cpu_wait_ticks: list[int] = []
        self.cpu_wait_first: int | None = self.cpu_wait.read()
        self.cpu_wait_last: int | None = self.cpu_wait_first
        self.scheduling: Scheduling = NORMAL
        self.read_delay: list[np.ndarray] = []
        self.in_flight = 0
        self.backlog: deque[tuple[Item, RawStream, Timing]] = deque()
        self.backlog_ready = asyncio.Event()
        self.current: Iterator[None] | None = None  # the stream being post-processed
        self.finished = 0
        self.max_in_flight = 0
        self.done = 0
        self.errors = 0
        self.tokens = 0
        self.kernel_streams = 0
        self.user_streams = 0
        self.kernel_sends = 0
        self.user_sends = 0

    # ---- control

    def rebase(self, start_ns: int) -> None:
        """Count the run from ``start_ns`` (a dealt run's common start, ``ShareRun.gate``)."""
        now_mono, now_wall = time.monotonic_ns(), datetime.now(UTC)
        self.start_ns = start_ns
        self.start_wall = now_wall - timedelta(microseconds=(now_mono - start_ns) / 1e3)
        if self.spec.max_duration_s:
            self.deadline_ns = start_ns + int(self.spec.max_duration_s * 1e9)

    def halt(self, reason: str, message: str) -> None:
        if self.halted is not None:
            return
        self.halted = reason
        for fut in list(self.sleepers):
            _set_once(fut)
        for sr in list(self.active):
            sr.abort(RequestStatus.CANCELLED, message)

    async def wait_until(
        self, t_ns: int, on_spin: Callable[[], None] | None = None, *, hold: bool = False
    ) -> None:
        """Return at ``t_ns`` (monotonic), never before it, or as soon as the run halts.

        The event loop's timers wake late by up to a millisecond (epoll waits in whole
        milliseconds, rounded up): the loop's timer sleeps until ``SPIN_NS`` before
        ``t_ns``, then the wait ends in zero-timeout loop rounds (I/O and other tasks
        served meanwhile) until the clock reaches ``t_ns``. ``on_spin`` is called as that
        last stretch begins (work to get out of the way before ``t_ns``); ``hold`` pauses
        post-processing meanwhile (one of its pieces may take a millisecond), unless its
        backlog is long."""
        if self.halted:
            return
        now = time.monotonic_ns()
        if t_ns - now > SPIN_NS:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self.sleepers.add(fut)
            h = loop.call_later((t_ns - SPIN_NS - now) / 1e9, _set_once, fut)
            try:
                await fut
            finally:
                h.cancel()
                self.sleepers.discard(fut)
        if on_spin is not None and not self.halted:
            on_spin()
        held = 1 if hold else 0
        self.holding += held
        try:
            while not self.halted and time.monotonic_ns() < t_ns:
                await asyncio.sleep(0)
        finally:
            self.holding -= held

    # ---- requests

    async def dispatch(self, items: list[Item]) -> None:
        burst = 0
        # every slot is free when a phase starts (the previous one waited for its requests)
        self.slots_taken = 0
        self.release_times.clear()
        for it in items:
            if self.halted:
                break
            it.route = route = self.router.request(it.index)
            params = self.body_params[route.model_idx]
            body = self.endpoint.body(it.prompt, params, self.endpoint_options)
            # the request bytes are built before the request is due: starting it is then
            # only socket setup, connect and one send
            rid = f"{self.run_tag}-{it.index}"
            req = finish_request(self.head(rid, route), body)
            sr = self.stream(rid, req, lane=route.lane)
            scheduled = self.start_ns + it.scheduled_ns
            if scheduled > time.monotonic_ns():
                # the kept-alive connection is taken (and checked) before the send is due
                free = sr is not None and not self.sem.locked()
                reserve = sr.reserve if sr is not None and free else None
                await self.wait_until(scheduled, reserve, hold=True)
                burst = 0
            if self.halted:
                if sr is not None:
                    sr.unreserve()
                break
            waited = self.sem.locked()
            await self.sem.acquire()
            if self.halted:
                self.sem.release()
                if sr is not None:
                    sr.unreserve()
                break
            # When the request could start: when it was due, or when the slot it took was
            # given back, if later (the k-th slot taken past the first ``slots`` is the k-th
            # one given back): its queue wait is the difference.
            if self.slots_taken < self.slots:
                self.slots_taken += 1
                due = scheduled
            else:
                due = max(scheduled, self.release_times.popleft())
            if waited and not self.capped and not it.warmup:
                self.pool_waits += 1
            # started here, not in the task's first step a loop round later
            stream = self.begin(sr, rid, route.lane)
            task = asyncio.create_task(self.complete(it, stream, due, scheduled))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            self.sent_total += 1
            if not it.warmup:
                self.sent_measured += 1
            # a burst of starts (rate inf, or a late schedule) lets the new requests connect
            # and the running streams read every few starts: ~0.2 ms of work per start
            burst += 1
            if burst >= BURST_STARTS:
                await asyncio.sleep(0)
                burst = 0
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    def head(self, rid: str, route: Route) -> bytes:
        """Request ``rid``'s line and headers on ``route``'s target."""
        lane = self.lanes[route.lane]
        return route_head(lane, route, rid, self.spec, self.own_headers, self.key_header)

    def session_route(self, s: int) -> Route:
        """Session ``s``'s route (every request of it)."""
        return self.router.session(s)

    def route_spec(self, route: Route) -> RunSpec:
        """The spec a session's bodies are built from: the run's, with the route's model."""
        return self.model_specs[route.model_idx]

    def stream(
        self,
        rid: str,
        req: bytes,
        on_end: Callable[[RawStream], None] | None = None,
        lane: int = 0,
    ) -> StreamRequest | None:
        """The request, ready to start (None when the target's address is unknown)."""
        to = self.lanes[lane]
        if to.addr is None:
            return None
        family, addr = to.addr
        lim = self.spec.limits
        return StreamRequest(
            to.target,
            addr,
            family,
            to.path,
            b"",
            [],
            request_id=rid,
            timeout_s=self.spec.request_timeout_s,
            clock=self.clock,
            kernel_stamps=self.kernel_stamps,
            request_bytes=req,
            pool=self.pool,
            on_end=on_end,
            max_event_bytes=lim.max_event_bytes,
            max_response_bytes=lim.max_response_bytes,
            max_response_events=lim.max_response_events,
            budget=self.budget,
        )

    def begin(self, sr: StreamRequest | None, rid: str, lane: int = 0) -> StreamRequest | RawStream:
        """Start ``sr`` now, on a slot the caller holds; ``complete`` must follow. Without a
        request (no address) the failed stream it would have been."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self.launch(sr, rid, lane)
        except BaseException:
            self.end_slot()
            raise

    def launch(
        self, sr: StreamRequest | None, rid: str, lane: int = 0
    ) -> StreamRequest | RawStream:
        """``begin`` without the slot's count: the stream, started (no await on the way)."""
        if sr is None:
            now = time.monotonic_ns()
            raw = RawStream(request_id=rid, t0_ns=now, end_ns=now)
            raw.status = RequestStatus.ERROR
            raw.error = self.lanes[lane].resolve_error or "target address unknown"
            return raw
        self.active.add(sr)
        try:
            sr.start()
        except BaseException:
            self.active.discard(sr)
            raise
        return sr

    def end_slot(self) -> None:
        self.in_flight -= 1
        self.release_times.append(time.monotonic_ns())
        self.sem.release()

    async def complete(
        self,
        it: Item,
        stream: StreamRequest | RawStream,
        due_ns: int,
        scheduled_ns: int,
    ) -> RawStream:
        """Wait for a request ``begin`` started; queue it for post-processing."""
        try:
            if isinstance(stream, StreamRequest):
                try:
                    # the body is decoded later, in post-processing slices
                    raw = await stream.wait(finalize=False)
                finally:
                    self.active.discard(stream)
            else:
                raw = stream
        finally:
            self.end_slot()
        if not it.warmup:
            self.finished += 1
        self.backlog.append((it, raw, Timing(due_ns, scheduled_ns)))
        self.backlog_ready.set()
        return raw

    def send_turn(
        self,
        rid: str,
        req: bytes,
        on_end: Callable[[RawStream], None] | None = None,
        lane: int = 0,
    ) -> StreamRequest | RawStream:
        """Send one turn of a multi-turn session (``app.client.sessions``) now: its stream,
        started. No await on the way, so a loop callback may call it (the turn after a
        reply, sent from where that reply ended). ``track_turn`` must follow, on a slot the
        caller then holds; ``on_end`` is called where its response ended."""
        self.sent_total += 1
        self.sent_measured += 1
        stream = self.stream(rid, req, on_end, lane)
        if stream is not None:  # its reply is wanted where it ends: decoded as it arrives
            stream.raw.decode_while_arriving(self.classifier())
        return self.launch(stream, rid, lane)

    def open_ahead(self, lane: int, n: int) -> None:
        """Open ``n`` idle connections to lane ``lane`` in the background, for requests
        about to fan out (``app.client.preconnect``): plain HTTP, within the run's bound."""
        to = self.lanes[lane]
        n = min(n, self.slots - self.pool.open - self.opener.pending)  # within the bound
        if to.addr is not None and not to.target.tls:
            self.opener.open(to.addr[1], to.addr[0], n)

    def classifier(self) -> ClassifyFn:
        """A fresh classifier of one answer of the run's surface."""
        return self.endpoint.classifier(self.endpoint_options)

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
    ) -> Coroutine[Any, Any, RawStream]:
        """Count the sent turn ``stream`` on the slot the caller holds (``sem`` acquired);
        await what it returns for the stream (its record is built in post-processing).
        ``scheduled_ns``: the session's arrival for its first turn (which may have waited
        for a session slot until ``due_ns``), ``due_ns`` for a later one (an agent trace's
        request: when it was ready, ``agent`` its place in the DAG)."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        it = Item(index, prompt, False, scheduled_ns - self.start_ns, session, turn, agent)
        it.route = route or it.route
        return self.complete(it, stream, due_ns, scheduled_ns)

    async def postprocess(self) -> None:
        """Decode and classify finished streams in resumable pieces (~0.1 ms each: body
        decoding, SSE splitting, a batch of events stamped or classified, token counting)
        run in slices of <= ~POSTPROCESS_SLICE_NS between I/O rounds, so no post-processing
        holds up reads for long, not even one long stream's; a slice ends early when a
        socket is ready, unless the backlog is long (``HOLD_BACKLOG_MAX``)."""
        sel = stamping_selector(asyncio.get_running_loop())
        while True:
            if self.current is None and not self.backlog:
                self.backlog_ready.clear()
                await self.backlog_ready.wait()
                continue
            t_end = time.monotonic_ns() + POSTPROCESS_SLICE_NS
            while time.monotonic_ns() < t_end and not self.held() and self.step():
                if sel is not None and len(self.backlog) <= HOLD_BACKLOG_MAX and sel.io_ready():
                    break  # a read first (a reply's end may be waiting): the rest next round
            await asyncio.sleep(0)

    def held(self) -> bool:
        """Post-processing pauses while a request is about to be sent (``wait_until``'s
        ``hold``), unless the backlog is long."""
        return self.holding > 0 and len(self.backlog) <= HOLD_BACKLOG_MAX

    def step(self) -> bool:
        """Run one piece of post-processing; False when there is nothing left to do."""
        if self.current is None:
            if not self.backlog:
                return False
            self.current = self.finish_steps(*self.backlog.popleft())
        try:
            next(self.current)
        except StopIteration:
            self.current = None
        return True

    def drain(self) -> None:
        while self.step():
            pass

    def finish(self, it: Item, raw: RawStream, timing: Timing) -> None:
        """Post-process one finished stream at once."""
        for _ in self.finish_steps(it, raw, timing):
            pass

    def finish_steps(self, it: Item, raw: RawStream, timing: Timing) -> Iterator[None]:
        try:
            rec = yield from record_steps(
                raw,
                index=it.index,
                scheduled_ns=it.scheduled_ns,
                run_start_ns=self.start_ns,
                tokenizer=self.tok,
                token_counting=self.spec.token_counting,
                warmup=it.warmup,
                input_tokens=it.prompt.input_tokens,
                classify=self.classifier(),
                rule=self.endpoint.result(it.prompt, self.endpoint_options),
                answer=self.endpoint.answer,
            )
        except Exception as e:  # a bug here must not lose the run
            rec = RequestRecord(
                index=it.index,
                scheduled_ns=it.scheduled_ns,
                sent_ns=raw.t0_ns - self.start_ns if raw.t0_ns else None,
                end_ns=raw.end_ns - self.start_ns if raw.end_ns else None,
                status=RequestStatus.ERROR,
                error=f"client failed to process the stream: {e!r}",
                warmup=it.warmup,
            )
        rec.queued_ns = max(0, timing.due_ns - timing.scheduled_ns)
        rec.session, rec.turn, rec.agent = it.session, it.turn, it.agent
        rec.model, rec.target = it.route.model, it.route.target
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)
        if raw.sent_any:
            if raw.send_clock is ClockSource.KERNEL:
                self.kernel_sends += 1
            else:
                self.user_sends += 1
        if raw.t0_ns:
            if raw.clock is ClockSource.KERNEL:
                self.kernel_streams += 1
                if not it.warmup and raw.ev_t:
                    self.read_delay.append(
                        np.asarray(raw.ev_user_t, np.int64) - np.asarray(raw.ev_t, np.int64)
                    )
            elif raw.kernel_reads or raw.user_reads:
                self.user_streams += 1
        if it.warmup:
            return
        if raw.t0_ns:
            self.send_times.append(raw.t0_ns)
        self.done += 1
        if rec.status is not RequestStatus.OK:
            self.errors += 1
        elif rec.output_tokens:
            self.tokens += rec.output_tokens

    # ---- monitor

    def progress(self) -> Progress:
        now = time.monotonic_ns()
        t_meas = (now - self.start_ns - self.measure_start_ns) / 1e9
        return Progress(
            elapsed_s=(now - self.start_ns) / 1e9,
            phase=self.phase,
            planned=self.planned,
            sent=self.sent_measured,
            done=self.finished,
            errors=self.errors,
            in_flight=self.in_flight,
            output_tokens=self.tokens,
            tokens_per_s=self.tokens / t_meas if self.phase != "warmup" and t_meas > 0 else 0.0,
        )

    def sample_cpu_wait(self) -> None:
        w = self.cpu_wait.read()
        if w is not None and self.cpu_wait_last is not None:
            self.cpu_wait_ticks.append(max(0, w - self.cpu_wait_last))
            self.cpu_wait_last = w

    async def monitor(self) -> None:
        period_ns = int(MONITOR_PERIOD_S * 1e9)
        next_clock = time.monotonic_ns() + int(CLOCK_RESAMPLE_S * 1e9)
        next_progress = time.monotonic_ns()
        while True:
            t = time.monotonic_ns()
            await asyncio.sleep(MONITOR_PERIOD_S)
            now = time.monotonic_ns()
            self.loop_lag.append(max(0, now - t - period_ns))
            self.sample_cpu_wait()
            # Objects that survived until now leave the cycle collector's view (O(1)): its
            # older generations would otherwise grow with every stream's capture lists and
            # records, and one collection over them stalls the loop for milliseconds.
            # Cyclic garbage frozen this way is reclaimed after the run (``run_load``).
            gc.freeze()
            if self.stop is not None and self.stop.is_set():
                self.halt("stopped", "run stopped by the user")
            if self.deadline_ns is not None and now >= self.deadline_ns:
                self.halt("max_duration", f"run hit max_duration_s={self.spec.max_duration_s:g}")
            if now >= next_clock:
                self.clock.resample()
                next_clock = now + int(CLOCK_RESAMPLE_S * 1e9)
            if self.on_progress is not None and now >= next_progress:
                self.on_progress(self.progress())
                next_progress = now + int(PROGRESS_PERIOD_S * 1e9)


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
