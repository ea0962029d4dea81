"""One load process of a dealt run: ``python -m app.client.shards FD`` (a fresh
interpreter: no fork after threads). It talks to the parent over one socket (``FD``, a
``multiprocessing.connection.Connection``).

Parent -> child: ``ChildJob`` (first), then ``("start", phase, t_ns)`` and ``("stop",)``.
Child -> parent: ``("ready", phase)`` when it is ready for ``phase`` ("run": imports done,
tokenizer loaded, target resolved, sockets reserved; "measure": its warm-ups done),
``("records", [RequestRecord, ...])`` in batches as they are final (global indices,
``process`` set), ``("progress", Progress)``, then ``("done", LoadResult without records,
ChildFigures)`` or ``("error", text)``.

The gate sleeps on the event loop's timer until ~1.2 ms before the start instant, then spins
on the clock (``load_run.SPIN_NS`` as ``wait_until`` does); ``ChildFigures.wake_ns`` is how
late it returned."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import resource
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from app.client import eventloop
from app.client.load_result import Progress
from app.client.runner import run_built
from app.client.shards.plan import Share, process_spec
from app.client.shards.share import ShareRun
from app.client.spec import RunSpec
from app.client.tokenizer import load_tokenizer
from app.domain import RequestRecord

SPIN_NS = 1_500_000
FLUSH_S = 0.05  # records are sent in batches at most this old
FLUSH_N = 64


@dataclass(frozen=True, slots=True)
class ChildJob:
    spec: RunSpec  # the run's spec (the child's own is ``process_spec``)
    share: Share
    run_tag: str
    source: str | None
    kernel_stamps: bool = True
    realtime: bool = False
    dataset_dirs: list[str] | None = None
    allow_link_local: bool = True
    warmups: int = 0  # the run's warm-ups, all processes together


@dataclass(slots=True)
class ChildFigures:
    """What a process measured of itself beyond its ``LoadResult``."""

    process: int
    pid: int
    wake_ns: dict[str, int] = field(default_factory=dict)  # phase -> return - start instant
    cpu_ready_s: float = 0.0  # the process's user + system CPU time when it was ready
    cpu_end_s: float = 0.0  # ... when its load ended

    @property
    def cpu_run_s(self) -> float:
        """CPU the process used from the common start to the end of its load."""
        return max(0.0, self.cpu_end_s - self.cpu_ready_s)


class _Gate:
    """``StartGate``: says "ready", then waits for the parent's instant and until it; a stop
    meanwhile returns at once (the runner then halts before sending anything)."""

    def __init__(
        self,
        send: Callable[[object], None],
        inbox: asyncio.Queue[int],
        figures: ChildFigures,
        stop: asyncio.Event,
    ) -> None:
        self.send = send
        self.inbox = inbox
        self.figures = figures
        self.stop = stop

    async def start_at(self, phase: str) -> int:
        if phase == "run":
            self.figures.cpu_ready_s = _cpu_s()
        self.send(("ready", phase))
        got = asyncio.ensure_future(self.inbox.get())
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not got.done():
            got.cancel()
            return time.monotonic_ns()
        t_ns = got.result()
        now = time.monotonic_ns()
        if t_ns - now > SPIN_NS:
            await asyncio.sleep((t_ns - now - SPIN_NS) / 1e9)
        while time.monotonic_ns() < t_ns:
            pass
        self.figures.wake_ns[phase] = time.monotonic_ns() - t_ns
        return t_ns


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Sender:
    """Sends records in batches from a thread of its own (pickling them off the load's
    event loop as much as the GIL allows); ``send`` is thread-safe for other messages."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.q: queue.SimpleQueue[RequestRecord | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name="records", daemon=True)
        self.thread.start()

    def send(self, msg: object) -> None:
        with self.lock:
            self.conn.send(msg)

    def _main(self) -> None:
        batch: list[RequestRecord] = []
        while True:
            try:
                rec = self.q.get(timeout=FLUSH_S)
            except queue.Empty:
                if batch:
                    self.send(("records", batch))
                    batch = []
                continue
            if rec is None:
                break
            batch.append(rec)
            if len(batch) >= FLUSH_N:
                self.send(("records", batch))
                batch = []
        if batch:
            self.send(("records", batch))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


def child_main(conn: Connection) -> None:
    """The spawned process's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run (``("stop",)``)
    job: ChildJob = conn.recv()
    try:
        eventloop.run(_main(conn, job))
    except BaseException as e:  # said to the parent; the process then ends
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


async def _main(conn: Connection, job: ChildJob) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[int] = asyncio.Queue()
    stop = asyncio.Event()
    figures = ChildFigures(job.share.process, os.getpid())
    sender = _Sender(conn)

    def listen() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent is gone: stop
                loop.call_soon_threadsafe(stop.set)
                return
            if msg[0] == "start":
                loop.call_soon_threadsafe(inbox.put_nowait, int(msg[2]))
            elif msg[0] == "stop":
                loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=listen, name="control", daemon=True).start()
    share = job.share
    spec = process_spec(job.spec, share)
    tok = load_tokenizer(spec.tokenizer, job.dataset_dirs)
    gate = _Gate(sender.send, inbox, figures, stop)
    process = share.process

    def on_record(rec: RequestRecord) -> None:
        rec.process = process
        sender.q.put(rec)

    def on_progress(p: Progress) -> None:
        sender.send(("progress", p))

    result = await run_built(
        spec,
        job.run_tag,
        tok,
        share.workload(job.source),
        share.sessions(job.source),
        on_progress=on_progress,
        stop=stop,
        kernel_stamps=job.kernel_stamps,
        on_record=on_record,
        realtime=job.realtime,
        allow_link_local=job.allow_link_local,
        share=ShareRun(share.warmup_index, share.index, share.session_ids, gate, job.warmups),
    )
    sender.close()
    figures.cpu_end_s = _cpu_s()
    result.records = []
    sender.send(("done", result, figures))


__all__ = ["ChildFigures", "ChildJob", "child_main"]
