"""Run a load: warm-up requests, then the measured schedule, on one asyncio event loop.

``run_load`` never raises for target problems: connection refused, HTTP errors, timeouts and
broken streams become per-request records. It stops early, keeping what was measured, on
``spec.max_duration_s`` (a whole-run limit, warm-up included) or when ``stop`` is set:
unsent requests are not sent (``counts["unsent"]``) and in-flight ones end as CANCELLED.

Each request records its queue wait (``queued_ns``: from when it was due, its scheduled
time, to when a concurrency slot and a connection were free). Client health is measured
alongside: send lag (``app.analysis.phases.send_lags``: what the client added between that
moment and the first byte leaving, connection setup apart), and event-loop lag (a monitor
task sleeping ~5 ms records how late it wakes). With every request due at once (an unlimited
rate), the initial burst is excluded from send lag and reported as a note: it has no
schedule to fall behind. Either p99 above ``spec.client_lag_bound_ms`` marks the run
``client_limited``. With kernel receive stamps
``read_delay`` (user-space stamp minus kernel stamp of the same read) shows how late the
client read data it had already received: timings stay exact, but events that one read
returns together share that read's stamp. ``cpu_wait`` (per monitor tick, from the thread's
scheduler statistics) tells how much of the loop lag was the CPU being held by other tasks;
``realtime=True`` runs the load thread at real-time priority to avoid that
(``app.client.sched``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
import time
from collections.abc import Callable, Sequence

from app.client import eventloop
from app.client.agent_sessions import drive_agents
from app.client.datasets.base import Prompt, Workload
from app.client.http_request import Target, parse_target
from app.client.lanes import resolve_lanes
from app.client.load_result import LagStats, LoadResult, Progress
from app.client.load_run import Item, LoadRun
from app.client.run_result import load_result
from app.client.sched import NORMAL, Scheduling, realtime_priority
from app.client.server_controls import ServerControls
from app.client.sessions import (
    Sessions,
    build_session_workload,
    drive_sessions,
    warmup_workload,
)
from app.client.shapes import schedule_for
from app.client.shards.share import ShareRun
from app.client.sockets import reserve_fds
from app.client.spec import RunSpec
from app.client.target_keys import resolve_api_key
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer, load_tokenizer
from app.client.workload import build_workload
from app.domain import RequestRecord

__all__ = ["LagStats", "LoadResult", "Progress", "run_built", "run_load", "run_load_sync"]


def _items(prompts_w: list[Prompt], prompts_m: list[Prompt], share: ShareRun | None) -> list[Item]:
    """Warm-ups take indices 0..W-1, measured requests W..; a dealt run's, their global ones."""
    w = len(prompts_w)
    iw = share.warmup_index if share else range(w)
    im = share.index if share else range(w, w + len(prompts_m))
    return [Item(i, p, True, 0) for i, p in zip(iw, prompts_w, strict=True)] + [
        Item(i, p, False, 0) for i, p in zip(im, prompts_m, strict=True)
    ]


async def run_load(
    spec: RunSpec,
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
    read_server_counters: bool = False,
) -> LoadResult:
    """Run ``spec`` against its target and return every request's record plus client health.

    ``run_tag`` prefixes each request's ``X-Request-Id`` (``<run_tag>-<index>``; warm-ups
    take indices 0..W-1, measured requests W..W+N-1). ``kernel_stamps=False`` forces
    user-space receive stamps. ``on_record`` is called with each request's record (warm-ups
    included, flagged) as soon as it is final, on the event loop: it must be quick and not raise.
    ``realtime=True`` runs the load thread at real-time priority (``app.client.sched``); it
    raises ``RealtimeRefused`` before anything is sent when the OS refuses it.
    ``dataset_dirs``: where ``spec.dataset_path`` and ``spec.tokenizer`` may point (a
    worker's configured directories; None: anywhere, the local CLI's own files).
    ``cancelled`` is polled while the workload is built: ``WorkloadCancelled`` then, before
    anything is sent.
    ``allow_link_local=False`` (workers) refuses a target that resolves to a link-local
    address (cloud metadata services): every request then fails saying so, none is sent.
    The server controls the spec asks for (``app.client.server_controls``) run at the
    measured window's edges; ``read_server_counters`` (a run observed by ``execute``, with
    ``scrape_metrics``) also reads the engine's speculative-decoding counters there.
    """
    spec = resolve_api_key(spec)  # refused before anything is sent: app.client.target_keys
    tok = load_tokenizer(spec.tokenizer, dataset_dirs)  # confined as dataset_path is
    sessions: Sessions | None = None
    if spec.multi_turn:
        sessions = build_session_workload(spec, tok, dataset_dirs, cancelled)
        workload = warmup_workload(sessions, tok)
    else:
        workload = build_workload(spec, tok, dataset_dirs=dataset_dirs, cancelled=cancelled)
    if spec.num_prompts is None or workload.agent is not None:  # a trace: its count now known
        spec = spec.model_copy(update={"num_prompts": len(workload.measured)})
    return await run_built(
        spec, run_tag, tok, workload, sessions, on_progress=on_progress, stop=stop,
        kernel_stamps=kernel_stamps, on_record=on_record, realtime=realtime,
        allow_link_local=allow_link_local, read_server_counters=read_server_counters,
    )  # fmt: skip


async def run_built(
    spec: RunSpec,
    run_tag: str,
    tok: BuiltinTokenizer | HFTokenizer,
    workload: Workload,
    sessions: Sessions | None,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
    kernel_stamps: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    realtime: bool = False,
    allow_link_local: bool = True,
    read_server_counters: bool = False,
    share: ShareRun | None = None,
) -> LoadResult:
    """``run_load`` once its workload is built (a dealt run's process: ``share``)."""
    target = parse_target(spec.base_url)

    # Everything allocated so far (modules, tokenizer, prompts) leaves the collector's view:
    # a full collection over it took ~40 ms, a stall long enough to merge stream reads.
    # Only the young generations are collected first: a full collection costs as much as
    # the process's heap (0.35 s in a test process, more in a long-lived server's), and
    # any older garbage frozen here is collected as usual once the run unfreezes it.
    gc.collect(1)
    gc.freeze()
    try:
        with realtime_priority(realtime) as scheduling:
            result = await _run(
                spec,
                run_tag,
                tok,
                target,
                workload,
                on_progress,
                stop,
                kernel_stamps,
                on_record,
                scheduling,
                allow_link_local,
                sessions,
                read_server_counters,
                share,
            )
            result.dataset_source = workload.source
            result.workload_stats = workload.stats
            return result
    finally:
        gc.unfreeze()


async def _run(
    spec: RunSpec,
    run_tag: str,
    tok: BuiltinTokenizer | HFTokenizer,
    target: Target,
    workload: Workload,
    on_progress: Callable[[Progress], None] | None,
    stop: asyncio.Event | None,
    kernel_stamps: bool,
    on_record: Callable[[RequestRecord], None] | None = None,
    scheduling: Scheduling = NORMAL,
    allow_link_local: bool = True,
    sessions: Sessions | None = None,
    read_server_counters: bool = False,
    share: ShareRun | None = None,
) -> LoadResult:
    schedule = schedule_for(spec, workload.at_ns)
    items = _items(workload.warmup, workload.measured, share)
    warm, measured = items[: len(workload.warmup)], items[len(workload.warmup) :]
    r = LoadRun(spec, run_tag, tok, target, on_progress, stop, kernel_stamps)
    r.on_record = on_record
    r.scheduling = scheduling
    if sessions is not None:  # the measured requests are the sessions' turns
        r.planned = sum(len(c.turns) for c in sessions.measured)
    await resolve_lanes(r.lanes, allow_link_local)
    # sockets for every stream that can be open at once, allocated before the clock matters
    reserve_fds(r.slots + 8)
    controls = (  # built before the monitor starts (its client's set-up is no loop lag);
        # a dealt run's processes leave them to the run as a whole (spec: one process)
        ServerControls(spec, read_counters=read_server_counters)
        if share is None and ServerControls.wanted(spec, read_server_counters)
        else None
    )
    if share is not None:  # ready: every process starts at one instant (or is stopped first)
        r.rebase(await share.gate.start_at("run"))
        if stop is not None and stop.is_set():
            r.halt("stopped", "run stopped by the user")
    mon = asyncio.create_task(r.monitor())
    post = asyncio.create_task(r.postprocess())
    try:
        if warm:
            for it in warm:
                it.scheduled_ns = time.monotonic_ns() - r.start_ns
            await r.dispatch(warm)
        ready = [lane.url for lane in r.lanes if lane.resolve_error is None]  # none refused
        if controls is not None and not r.halted and ready:
            await controls.before_measure(ready)  # reset, counters, profiler (after warm-ups)
        r.phase = "measure"
        r.measure_start_ns = time.monotonic_ns() - r.start_ns
        if share is not None and share.warmups:  # the measured phase too starts at one instant
            r.measure_start_ns = await share.gate.start_at("measure") - r.start_ns
        for it, t in zip(measured, schedule.times_ns.tolist(), strict=sessions is None):
            it.scheduled_ns = r.measure_start_ns + int(t)
        if not r.halted and sessions is not None:
            ids = share.session_ids if share else None
            await drive_sessions(r, sessions, schedule.times_ns.tolist(), len(warm), ids)
        elif not r.halted and workload.agent is not None:  # an agent trace's DAGs
            await drive_agents(r, workload.agent, len(warm))
        elif not r.halted:
            await r.dispatch(measured)
    finally:
        if r.tasks:  # only when cancelled from outside: end streams, keep their records
            r.halt("stopped", "run cancelled")
            await asyncio.gather(*r.tasks, return_exceptions=True)
        r.phase = "done"
        for t in (mon, post):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        r.drain()
        await r.opener.close()
        r.pool.close_all()
        r.sample_cpu_wait()
        r.cpu_wait.close()
        end_ns = time.monotonic_ns() - r.start_ns
        if controls is not None:  # the profiler stopped, the counters read: after the end
            await controls.after_measure()
    r.clock.resample()
    if on_progress is not None:
        on_progress(r.progress())
    result = load_result(r, end_ns)
    if controls is not None:
        result.server_controls = controls.record
        result.notes.extend(controls.notes)
    return result


def run_load_sync(
    spec: RunSpec,
    *,
    run_tag: str,
    on_progress: Callable[[Progress], None] | None = None,
    kernel_stamps: bool = True,
    handle_sigint: bool = True,
    realtime: bool = False,
) -> LoadResult:
    """``asyncio.run(run_load(...))``; Ctrl-C (main thread only) stops the run cleanly and
    returns what was measured."""

    async def main() -> LoadResult:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = False
        if handle_sigint and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGINT, stop.set)
                installed = True
        try:
            return await run_load(
                spec,
                run_tag=run_tag,
                on_progress=on_progress,
                stop=stop,
                kernel_stamps=kernel_stamps,
                realtime=realtime,
            )
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    return eventloop.run(main())
