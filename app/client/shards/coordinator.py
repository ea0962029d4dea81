"""The parent of a dealt run: builds the plan once, spawns one load process per share
(``child``), starts them together, streams their records and merges them into one run.

The common start: each process says "ready" (imports done, tokenizer loaded, target
resolved, sockets reserved); once every live one has, the parent sends them one instant,
``monotonic_ns() + START_MARGIN_NS`` (``CLOCK_MONOTONIC``, the same clock in every process
of the host), and each waits until it (``child._Gate``). With warm-ups, the measured phase
starts the same way once every process has finished its warm-ups.

A stop (``stop`` set: Ctrl-C, a cancelled job) is sent to every process; each ends its
streams and reports what it measured. A process that dies leaves its unrecorded requests
lost, said in the run (``merge``). Cancelled from outside, the parent stops every process,
waits for them a while, then ends any left."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

from app.client.load_result import LoadResult, Progress
from app.client.shards.child import ChildFigures, ChildJob
from app.client.shards.merge import ProcessOutcome, merge
from app.client.shards.plan import Plan, build_plan, usable_cores
from app.client.shards.share import InstantGate
from app.client.spec import RunSpec
from app.client.target_keys import resolve_api_key
from app.client.tokenizer import load_tokenizer
from app.domain import RequestRecord

START_MARGIN_NS = 50_000_000  # from the last "ready" to the common start
READY_TIMEOUT_S = 300.0  # from spawning to every process ready (imports, tokenizer)
STOP_WAIT_S = 30.0  # cancelled from outside: how long the processes get to report


class _Child:
    def __init__(self, p: int, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self.p = p
        self.proc = proc
        self.conn = conn
        self.lock = threading.Lock()
        self.ended = False

    def send(self, msg: object) -> None:
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(msg)


def _spawn(plan: Plan, job: Callable[[int], ChildJob]) -> list[_Child]:
    """``python -m app.client.shards FD P`` per share (``P``: its number, for ``ps``), a
    socket pair its channel: a
    fresh interpreter (no fork after threads, no re-import of the caller's main module)."""
    children: list[_Child] = []
    for share in plan.shares:
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.client.shards", str(fd), str(share.process)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        child = _Child(share.process, proc, Connection(mine.detach()))
        child.send(job(share.process))
        children.append(child)
    return children


def _listen(child: _Child, post: Callable[[int, tuple[Any, ...]], None]) -> None:
    while True:
        try:
            msg = child.conn.recv()
        except (EOFError, OSError):
            post(child.p, ("eof",))
            return
        except Exception as e:  # a message that does not load: the process is lost to the run
            post(child.p, ("error", f"unreadable message: {e!r}"))
            with contextlib.suppress(OSError):
                child.proc.kill()
            continue
        post(child.p, msg)


class _Coordinator:
    def __init__(
        self,
        plan: Plan,
        children: list[_Child],
        on_record: Callable[[RequestRecord], None] | None,
        on_progress: Callable[[Progress], None] | None,
        outer: InstantGate | None = None,
    ) -> None:
        self.outer = outer  # a shard's processes: the instants come from the server
        self.outer_tasks: list[asyncio.Task[None]] = []
        self.plan = plan
        self.children = children
        self.on_record = on_record
        self.on_progress = on_progress
        self.outcomes = [ProcessOutcome(s.process, s.planned) for s in plan.shares]
        self.ready: dict[str, set[int]] = {"run": set(), "measure": set()}
        self.started: dict[str, int] = {}
        self.progress: dict[int, Progress] = {}
        self.session_index = plan.warmups  # multi-turn: global indices in arrival order
        self.inbox: asyncio.Queue[tuple[int, tuple[Any, ...]]] = asyncio.Queue()
        self.outer_error: Exception | None = None

    def live(self) -> list[_Child]:
        return [c for c in self.children if not c.ended]

    def stop_all(self) -> None:
        for c in self.live():
            c.send(("stop",))

    def barrier(self, phase: str) -> None:
        if phase in self.started:
            return
        live = self.live()
        if live and all(c.p in self.ready[phase] for c in live):
            if self.outer is not None:  # every shard's processes: the server's instant
                self.started[phase] = -1  # asked once; set when the instant comes
                self.outer_tasks.append(asyncio.create_task(self._outer_start(phase)))
                return
            self.send_start(phase, time.monotonic_ns() + START_MARGIN_NS)

    def send_start(self, phase: str, t: int) -> None:
        self.started[phase] = t
        for c in self.live():
            c.send(("start", phase, t))

    async def _outer_start(self, phase: str) -> None:
        assert self.outer is not None
        try:
            t = await self.outer.instant(phase)
        except Exception as e:  # the shard cannot start: every process stops
            self.outer_error = e
            self.stop_all()
            t = time.monotonic_ns()
        self.send_start(phase, t)

    def handle(self, p: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        out = self.outcomes[p]
        if kind == "records":
            for rec in msg[1]:
                if self.plan.spec.multi_turn and not rec.warmup:
                    rec.index = self.session_index
                    self.session_index += 1
                out.records.append(rec)
                if self.on_record is not None:
                    self.on_record(rec)
        elif kind == "ready":
            self.ready[msg[1]].add(p)
            self.barrier(msg[1])
        elif kind == "progress":
            self.progress[p] = msg[1]
            self.report()
        elif kind == "done":
            result: LoadResult = msg[1]
            figures: ChildFigures = msg[2]
            out.result = result
            out.wake_ns = dict(figures.wake_ns)
            out.cpu_run_s = figures.cpu_run_s
            out.pid = figures.pid
        elif kind == "error":
            out.error = str(msg[1])
        elif kind == "eof":
            child = self.children[p]
            child.ended = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(5.0)
            if out.result is None and out.error is None:
                out.error = f"the process exited with code {child.proc.returncode}"
            for phase in self.ready:  # the others need not wait for it
                self.barrier(phase)

    def report(self) -> None:
        if self.on_progress is None or not self.progress:
            return
        ps = list(self.progress.values())
        phases = {q.phase for q in ps}
        self.on_progress(
            Progress(
                elapsed_s=max(q.elapsed_s for q in ps),
                phase=next((x for x in ("warmup", "measure") if x in phases), "done"),
                planned=self.plan.planned,
                sent=sum(q.sent for q in ps),
                done=sum(q.done for q in ps),
                errors=sum(q.errors for q in ps),
                in_flight=sum(q.in_flight for q in ps),
                output_tokens=sum(q.output_tokens for q in ps),
                tokens_per_s=sum(q.tokens_per_s for q in ps),
            )
        )  # fmt: skip


async def run_processes(
    spec: RunSpec,
    processes: int,
    *,
    run_tag: str,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
    kernel_stamps: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    realtime: bool = False,
    dataset_dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
    allow_link_local: bool = True,
) -> LoadResult:
    """``app.client.runner.run_load`` over ``processes`` load processes (the module doc)."""
    spec = resolve_api_key(spec)
    tok = load_tokenizer(spec.tokenizer, dataset_dirs)
    plan = build_plan(spec, processes, tok, dataset_dirs=dataset_dirs, cancelled=cancelled)
    return await run_plan(
        plan,
        tok.name,
        run_tag=run_tag,
        on_progress=on_progress,
        stop=stop,
        kernel_stamps=kernel_stamps,
        on_record=on_record,
        realtime=realtime,
        dataset_dirs=dataset_dirs,
        allow_link_local=allow_link_local,
    )


async def run_plan(
    plan: Plan,
    tokenizer: str,
    *,
    run_tag: str,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
    kernel_stamps: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    realtime: bool = False,
    dataset_dirs: Sequence[str] | None = None,
    allow_link_local: bool = True,
    gate: InstantGate | None = None,
) -> LoadResult:
    """A built plan run over its shares' processes. ``gate``: the instants come from it
    (``instant``: a shard of a run dealt over workers, whose processes start with every
    other shard's), asked once all of this host's processes are ready for the phase."""
    notes = list(plan.notes)
    cores = usable_cores()
    if plan.processes > cores:
        notes.append(
            f"{plan.processes} load processes on {cores} usable cores: the client may be "
            "starved of CPU (its lag figures say whether it was)"
        )
    dirs = list(dataset_dirs) if dataset_dirs is not None else None

    def job(p: int) -> ChildJob:
        return ChildJob(
            plan.spec, plan.shares[p], run_tag, plan.source, kernel_stamps, realtime, dirs,
            allow_link_local, plan.warmups,
        )  # fmt: skip

    children = await asyncio.to_thread(_spawn, plan, job)
    loop = asyncio.get_running_loop()
    co = _Coordinator(plan, children, on_record, on_progress, gate)

    def post(p: int, msg: tuple[Any, ...]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
            loop.call_soon_threadsafe(co.inbox.put_nowait, (p, msg))

    for c in children:
        threading.Thread(target=_listen, args=(c, post), name=f"load-{c.p}", daemon=True).start()

    async def watch_stop() -> None:
        if stop is not None:
            await stop.wait()
            co.stop_all()

    watcher = asyncio.create_task(watch_stop())
    ready_by = time.monotonic() + READY_TIMEOUT_S
    try:
        while co.live():
            if "run" in co.started:
                p, msg = await co.inbox.get()
            else:
                try:
                    p, msg = await asyncio.wait_for(co.inbox.get(), ready_by - time.monotonic())
                except TimeoutError:
                    raise RuntimeError(
                        f"processes: {len(co.ready['run'])} of {plan.processes} load processes "
                        f"were ready after {READY_TIMEOUT_S:g} s"
                    ) from None
            co.handle(p, msg)
    except BaseException:
        co.stop_all()
        await asyncio.to_thread(_reap, children, STOP_WAIT_S)
        raise
    finally:
        watcher.cancel()
        for t in (watcher, *co.outer_tasks):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    await asyncio.to_thread(_reap, children, 5.0)
    if co.outer_error is not None:
        raise co.outer_error
    results = [o.result for o in co.outcomes if o.result is not None]
    t_run = co.started.get("run", -1)
    t_run = t_run if t_run >= 0 else time.monotonic_ns()  # -1: asked, never answered
    t_measure = co.started.get("measure", -1)
    t_measure = t_measure if t_measure >= 0 else t_run
    return merge(
        plan,
        co.outcomes,
        start_ns=t_run,
        start_wall=results[0].start_wall if results else _wall_at(t_run),
        measure_start_ns=t_measure - t_run,
        end_ns=max((r.end_ns for r in results), default=time.monotonic_ns() - t_run),
        stopped="stopped" if stop is not None and stop.is_set() else None,
        tokenizer=tokenizer,
        notes=notes,
    )


def _wall_at(t_mono_ns: int) -> datetime:
    return datetime.now(UTC) - timedelta(microseconds=(time.monotonic_ns() - t_mono_ns) / 1e3)


def _reap(children: list[_Child], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(max(0.0, deadline - time.monotonic()))
    for c in children:
        if c.proc.poll() is None:
            c.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(5.0)
        with contextlib.suppress(OSError):
            c.conn.close()
