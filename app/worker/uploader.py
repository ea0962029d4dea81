"""Upload one job's results: numbered batches, spooled to disk first, sent in order, each
retried (with backoff) until the server acknowledges it; then the completion.

Batch ``n`` is written to the spool before it is sent and deleted only once acknowledged, so
a server restart (connection refused for a while) or a worker restart loses nothing, and a
batch sent twice is acknowledged as a duplicate by the server: nothing is duplicated.

A batch the server keeps refusing (``MAX_REJECTIONS`` answers that are neither a lost lease
nor an unreachable server) is never dropped: sending stops there (``refused``), the job
completes ``failed`` with the server's reason (``refused_request``), and the batch stays in
the spool with every later one, which the job then keeps (``JobSpool.keep``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from app.domain import RequestRecord
from app.protocol.wire import CompleteRequest, CompleteResponse, ResultBatch, WireRequest
from app.worker.backoff import Backoff
from app.worker.client import (
    AuthError,
    BatchesMissing,
    LeaseLost,
    NotFound,
    ProtocolError,
    ServerUnreachable,
    WorkerClient,
)
from app.worker.spool import JobSpool

log = logging.getLogger(__name__)

MAX_REJECTIONS = 5  # the same request refused this often (4xx other than 409/404): stop
MAX_RESENDS = 3  # "batches missing" answers to complete before giving up
DRAIN_POLL_S = 0.02


def _remaining(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()


@dataclass(frozen=True, slots=True)
class Refusal:
    """The batch the server kept refusing, and its last answer."""

    batch_no: int
    times: int
    reason: str

    def text(self, kept: object) -> str:
        return (
            f"the server refused result batch {self.batch_no} ({self.times} times): "
            f"{self.reason}; it and every later batch are kept in the worker's spool at {kept}"
        )


class Uploader:
    """Sends the spooled batches of one job attempt, in order.

    ``lost`` is set (and the ``lost_event``s) when the server says the lease is no longer
    ours (409/404): nothing more is uploaded for this job. ``refused`` is set (and
    ``on_refused`` called) when the server keeps refusing one batch: nothing more is sent,
    but the job is still ours to complete (as failed)."""

    def __init__(
        self,
        client: WorkerClient,
        spool: JobSpool,
        backoff: Backoff,
    ) -> None:
        self.client = client
        self.spool = spool
        self.job = spool.job
        self.backoff = backoff
        self.unacked: deque[int] = deque(spool.pending())
        self.next_batch_no = self.unacked[-1] + 1 if self.unacked else 0
        self.accepted = 0  # requests the server stored as new
        self.duplicates = 0  # batches the server already had
        self.lost: str | None = None
        self.refused: Refusal | None = None
        self.on_refused: Callable[[], None] | None = None
        self.recorded: Counter[str | None] = Counter()  # requests queued, by step run (or None)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lost_waiters: list[asyncio.Event] = []

    # ---- lifecycle

    def start(self) -> None:
        self._task = asyncio.create_task(self._send_loop(), name=f"upload-{self.job.job_id}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def lost_event(self) -> asyncio.Event:
        """An event set when the job is lost (for callers that want to react at once)."""
        ev = asyncio.Event()
        if self.lost is not None:
            ev.set()
        self._lost_waiters.append(ev)
        return ev

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            log.warning("job %s: %s; nothing more is sent for it", self.job.job_id, reason)
        for ev in self._lost_waiters:
            ev.set()

    def refuse(self, batch_no: int, times: int, reason: str) -> None:
        if self.refused is None:
            self.refused = Refusal(batch_no, times, reason)
            log.error(
                "job %s: batch %d refused %d times (%s); stopping, its results stay spooled",
                self.job.job_id,
                batch_no,
                times,
                reason,
            )
            if self.on_refused is not None:
                self.on_refused()

    def sent_batches(self) -> int:
        """The batch count a completion declares: every batch numbered so far, or (refused)
        those before the refused one, which all arrived (batches are sent in order)."""
        return self.refused.batch_no if self.refused is not None else self.next_batch_no

    def refused_request(self, req: CompleteRequest) -> CompleteRequest:
        """``req`` as a refused batch leaves it: failed with the server's reason, declaring
        only the batches that arrived (unchanged when nothing was refused)."""
        if self.refused is None:
            return req
        why = self.refused.text(self.spool.kept_path())
        error = f"{req.error}; {why}" if req.error and req.status == "failed" else why
        return req.model_copy(
            update={"status": "failed", "error": error, "total_batches": self.sent_batches()}
        )

    # ---- batches

    async def add(self, records: list[RequestRecord], run_id: str | None = None) -> int:
        """Number, spool (atomically, off the event loop) and queue one batch; returns its
        number. ``run_id``: the sweep step's run the records belong to."""
        no = self.next_batch_no
        self.next_batch_no += 1
        batch = ResultBatch(
            lease_id=self.job.lease_id,
            batch_no=no,
            requests=[WireRequest.from_record(r) for r in records],
            run_id=run_id,
        )
        await asyncio.to_thread(self.spool.write, batch)
        self.recorded[run_id] += len(records)
        self.unacked.append(no)
        self._wake.set()
        return no

    async def _send_loop(self) -> None:
        rejections = 0
        while self.lost is None and self.refused is None:
            if not self.unacked:
                self._wake.clear()
                await self._wake.wait()
                continue
            no = self.unacked[0]
            data = self.spool.read(no)
            if data is None:  # not spooled (any more): nothing to send
                self.unacked.popleft()
                continue
            try:
                ack = await self.client.upload(self.job.job_id, data)
            except ServerUnreachable as e:
                delay = self.backoff.next()
                log.info("job %s: batch %d not sent (%s); retry in %.1fs", _id(self), no, e, delay)
                await asyncio.sleep(delay)
                continue
            except (LeaseLost, NotFound) as e:
                self.lose(f"lease lost while uploading batch {no}: {e}")
                return
            except (AuthError, ProtocolError) as e:
                rejections += 1
                if rejections >= MAX_REJECTIONS:
                    self.refuse(no, rejections, str(e))
                    return
                log.warning("job %s: batch %d refused: %s", _id(self), no, e)
                await asyncio.sleep(self.backoff.next())
                continue
            rejections = 0
            self.backoff.reset()
            self.spool.ack(no)
            if self.unacked and self.unacked[0] == no:
                self.unacked.popleft()
            self.accepted += ack.accepted
            self.duplicates += int(ack.duplicate)

    async def drain(self, deadline: float | None = None) -> bool:
        """Wait until every queued batch is acknowledged; False when the job was lost, a
        batch was refused, or ``deadline`` (``time.monotonic()``) passed first."""
        while self.unacked and self.lost is None and self.refused is None:
            if _remaining(deadline) <= 0:
                return False
            if self._task is None or self._task.done():
                self.start()
            await asyncio.sleep(DRAIN_POLL_S)
        return self.lost is None and self.refused is None

    # ---- completion

    async def complete(
        self, req: CompleteRequest, deadline: float | None = None
    ) -> CompleteResponse | None:
        """Send the completion (retrying); re-sends batches the server says are
        missing. None when the job was lost or the deadline passed."""
        resends = 0
        rejections = 0
        while self.lost is None and _remaining(deadline) > 0:
            try:
                resp = await self.client.complete(self.job.job_id, req)
            except ServerUnreachable as e:
                delay = min(self.backoff.next(), max(0.0, _remaining(deadline)))
                log.info("job %s: completion not sent (%s); retry in %.1fs", _id(self), e, delay)
                await asyncio.sleep(delay)
                continue
            except BatchesMissing as e:
                present = [n for n in e.missing if self.spool.read(n) is not None]
                if resends >= MAX_RESENDS or len(present) < len(e.missing):
                    self.lose(f"the server misses batches {e.missing} (not spooled any more)")
                    return None
                resends += 1
                self.unacked = deque(sorted(set(self.unacked) | set(present)))
                self._wake.set()
                await self.drain(deadline)
                continue
            except (LeaseLost, NotFound) as e:
                self.lose(f"lease lost at completion: {e}")
                return None
            except (AuthError, ProtocolError) as e:
                rejections += 1
                if rejections >= MAX_REJECTIONS:
                    self.lose(f"completion refused {rejections} times: {e}")
                    return None
                await asyncio.sleep(self.backoff.next())
                continue
            self.backoff.reset()
            return resp
        return None


def _id(u: Uploader) -> str:
    return u.job.job_id
