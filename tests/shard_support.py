"""Workers for the tests of runs dealt over workers (``shards``): in-process ``Worker``s of
one live server, each with its own state directory, and ways to have them take jobs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from app.worker.loop import Worker
from tests.live_server import LiveServer
from tests.test_worker import FAST


def shard_workers(server: LiveServer, tmp_path: Path, n: int, processes: int = 1) -> list[Worker]:
    """``n`` workers of ``server`` (worker k's state in ``tmp_path / "wk"``), each giving a
    run ``processes`` load processes (``tokentrace worker --processes``)."""
    opts = dataclasses.replace(FAST, processes=processes)
    return [
        Worker(
            server.url,
            server.worker_token,
            state_dir=tmp_path / f"w{k}",
            name=f"w{k}",
            options=opts,
        )
        for k in range(n)
    ]


async def serve(w: Worker, jobs: int, timeout_s: float = 60.0) -> list[Any]:
    """``jobs`` jobs, one after the other (asked again while none is queued), for at most
    ``timeout_s``; their outcomes."""
    done: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(done) < jobs and time.monotonic() < deadline:
        outcome = await w.run_once()
        if outcome is None:
            await asyncio.sleep(0.05)
        else:
            done.append(outcome)
    return done


async def one_job_each(workers: list[Worker]) -> list[Any]:
    """Each worker's first job's outcome (None: it got none within 60 s)."""
    got = await asyncio.gather(*(serve(w, 1) for w in workers))
    return [d[0] if d else None for d in got]
