"""The worker ``tokentrace serve`` starts next to itself, so one machine works out of the box.

It runs ``Worker.run_forever`` on a background thread with its own event loop (its loads run
on a further thread: see ``app.worker.load_thread``). ``stop()`` ends it cleanly: a running
job stops its load, uploads what it can within the grace, and completes as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from app.wire import JobKind
from app.worker.loop import Worker, WorkerOptions

log = logging.getLogger(__name__)


class LocalWorkerHandle:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tokentrace-worker", daemon=True)

    def start(self) -> LocalWorkerHandle:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as e:
            self.error = e
            log.exception("the local worker stopped with an error")
        finally:
            self._ready.set()

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await self.worker.run_forever(self._stop)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the worker and wait (up to ``timeout_s``) for its thread to end."""
        loop, ev = self._loop, self._stop
        if loop is not None and ev is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(ev.set)
        self._thread.join(timeout_s)


def start_local_worker(
    server_url: str,
    token: str,
    *,
    labels: dict[str, str] | None = None,
    state_dir: Path | None = None,
    name: str = "local",
    options: WorkerOptions | None = None,
    kinds: Sequence[JobKind] = ("bench", "sweep"),
) -> LocalWorkerHandle:
    """Start a worker for ``server_url`` on a background thread; ``.stop()`` ends it.

    Registering retries with backoff, so it may start before the server listens."""
    opts = options or WorkerOptions(shutdown_grace_s=5.0)
    worker = Worker(
        server_url,
        token,
        labels=labels,
        state_dir=state_dir,
        name=name,
        options=opts,
        kinds=kinds,
    )
    return LocalWorkerHandle(worker).start()
