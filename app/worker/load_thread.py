"""Run one load (``app.client.runner.run_load``) on its own thread and event loop.

The measurement loop then shares nothing with the worker's control loop (heartbeats,
uploads, disk writes): a slow server or a fsync never delays a stream read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from app.client import eventloop
from app.client.load_result import LoadResult, Progress
from app.client.shards.load import run_load
from app.client.shards.worker_share import ShardFigures, ShardGateLike, run_shard
from app.client.spec import RunSpec
from app.domain import RequestRecord


class LoadThread:
    def __init__(
        self,
        spec: RunSpec,
        *,
        run_tag: str,
        on_record: Callable[[RequestRecord], None],
        on_progress: Callable[[Progress], None],
        kernel_stamps: bool = True,
        realtime: bool = False,
        dataset_dirs: tuple[str, ...] = (),
        allow_link_local: bool = True,
        shard: tuple[ShardFigures, ShardGateLike] | None = None,
    ) -> None:
        self.spec = spec
        self.run_tag = run_tag
        self._on_record = on_record
        self._on_progress = on_progress
        self._kernel_stamps = kernel_stamps
        self._realtime = realtime
        self._dataset_dirs = dataset_dirs
        self._allow_link_local = allow_link_local
        self._shard = shard  # a run dealt over workers: this worker's shard (worker_share)
        self._result: concurrent.futures.Future[LoadResult] = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._thread = threading.Thread(target=self._main, name="tokentrace-load", daemon=True)

    def start(self) -> LoadThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the load to stop (thread-safe): unsent requests are skipped, in-flight ones end
        as cancelled, and the result keeps everything measured."""
        with self._lock:
            self._stop_requested = True
            loop, ev = self._loop, self._stop
        if loop is not None and ev is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: the load is over
                loop.call_soon_threadsafe(ev.set)

    def _cancel_requested(self) -> bool:
        """Polled while the workload is built (before the event loop serves the stop)."""
        return self._stop_requested

    async def result(self) -> LoadResult:
        return await asyncio.wrap_future(self._result)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            res = eventloop.run(self._amain())
        except BaseException as e:  # handed to the awaiting loop
            self._result.set_exception(e)
        else:
            self._result.set_result(res)

    async def _amain(self) -> LoadResult:
        stop = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._stop = stop
            if self._stop_requested:
                stop.set()
        try:
            common: dict[str, Any] = {
                "run_tag": self.run_tag,
                "on_progress": self._on_progress,
                "stop": stop,
                "kernel_stamps": self._kernel_stamps,
                "realtime": self._realtime,
                "on_record": self._on_record,
                "dataset_dirs": self._dataset_dirs,
                "cancelled": self._cancel_requested,
                "allow_link_local": self._allow_link_local,
            }
            if self._shard is not None:
                figures, gate = self._shard
                return await run_shard(self.spec, figures, gate, **common)
            # execute observes the run: the server's counters are read around it
            return await run_load(self.spec, read_server_counters=True, **common)
        finally:
            with self._lock:
                self._loop = None
                self._stop = None
