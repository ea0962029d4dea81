"""``run_load`` for every caller: one process (``app.client.runner``), or the run's
``processes`` load processes on this host (``coordinator``)."""

from __future__ import annotations

from typing import Any

from app.client.load_result import LoadResult
from app.client.runner import run_load as run_one
from app.client.shards.coordinator import run_processes
from app.client.shards.plan import resolve_processes
from app.client.spec import RunSpec


async def run_load(spec: RunSpec, **kw: Any) -> LoadResult:
    """``app.client.runner.run_load``'s arguments and result; ``spec.processes`` above 1
    (``auto``: the cores this machine can spare) deals the run to that many processes."""
    n = resolve_processes(spec.processes)
    if n <= 1:
        return await run_one(spec, **kw)
    # the server controls and their counter readings wrap one measured window: a dealt
    # run has one per process, so they are left out (the spec refuses reset and profile)
    kw.pop("read_server_counters", None)
    return await run_processes(spec, n, **kw)
