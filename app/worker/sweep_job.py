"""Execute one leased sweep job: the steps in order, each a run created on the server.

The plan is driven by ``app.client.sweep_plan.drive`` (the same planning and saturation
rules as a local sweep) on a thread; each step it asks for runs here, on the worker's event
loop: create the step's run (``POST /jobs/{id}/steps``), run the load, upload its requests
through the job's spooled ``Uploader`` (batches name the step's run), then finalize the step
(``POST /jobs/{id}/steps/{n}/complete``), whose answer is the step's summary.

Heartbeats carry "step n of N"; a cancel stops the current step's load, finalizes what it
measured and completes the job as cancelled (finished steps are kept); a lost lease drops
the job; a stopped worker completes it as cancelled within the grace.

A resumed attempt (the lease's ``resume``: an earlier worker was lost) replays the steps
already completed: ``drive`` asks for them in order as usual and gets their stored
summaries back without running anything, after a check that the plan asks for the same
load, kind and role at each (``Replay``); so an auto sweep makes the same choices. A
mismatch fails the job naming the step. Batches are numbered from ``first_batch_no``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from pydantic import ValidationError

from app.analysis.sweep import LoadKind, StepSummary
from app.client.execute import execute, series_to_wire
from app.client.sweep_plan import (
    drive,
    plan_of,
    planned_steps,
    step_from_dict,
    step_label,
    step_spec,
)
from app.protocol.wire import ResumedStep, StepComplete, StepCreate
from app.worker.backoff import Backoff
from app.worker.client import (
    AuthError,
    BatchesMissing,
    LeaseLost,
    NotFound,
    ProtocolError,
    ServerUnreachable,
    describe,
)
from app.worker.job import CompleteStatus, JobOutcome, JobRun, spec_from_job
from app.worker.load_thread import LoadThread
from app.worker.processes import with_worker_processes

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_REJECTIONS = 5


class SweepStopped(Exception):
    """The sweep ends before its plan: cancelled, the worker stopping, or the job lost."""

    def __init__(self, status: CompleteStatus | None, reason: str, error: str | None = None):
        super().__init__(reason)
        self.status = status  # None: the job is lost (nothing more to send)
        self.reason = reason
        self.error = error


class ReplayMismatch(Exception):
    """A completed step of an earlier attempt is not what the plan asks for now."""


def _describe(load: float | None, kind: str, role: str) -> str:
    text = step_label(
        math.inf if load is None else load, "rate" if kind == "rate" else "concurrency"
    )
    return f"{text} ({role})"


class Replay:
    """The steps earlier attempts of a sweep job completed (steps 0..n-1), handed back in
    order instead of being run again."""

    def __init__(self, steps: Sequence[ResumedStep]) -> None:
        self.steps = list(steps)
        for i, st in enumerate(self.steps):
            if st.step_idx != i:
                raise ReplayMismatch(f"resume: completed steps are not 0..{len(steps) - 1}")

    def __len__(self) -> int:
        return len(self.steps)

    def summary(self, idx: int, load: float, kind: LoadKind, role: str) -> StepSummary | None:
        """Step ``idx``'s stored summary (None: not completed, run it), checked against what
        the plan asks for; raises ``ReplayMismatch`` when they differ."""
        if idx >= len(self.steps):
            return None
        st = self.steps[idx]
        want = None if math.isinf(load) else float(load)
        role = "probe" if role == "probe" else "step"
        same_load = (st.load is None) == (want is None) and (
            st.load is None or want is None or math.isclose(st.load, want, rel_tol=1e-9)
        )
        if not (same_load and st.load_kind == kind and st.role == role):
            raise ReplayMismatch(
                f"resume: step {idx} ran at {_describe(st.load, st.load_kind, st.role)} on an "
                f"earlier attempt, but the plan now asks for {_describe(want, kind, role)}; "
                "not re-running it"
            )
        return step_from_dict(st.summary)


class _Bridge:
    """``app.client.sweep_plan.StepRunner`` for ``drive`` (on a thread): a step completed by an
    earlier attempt is replayed; any other runs as a coroutine on the worker's loop."""

    def __init__(self, sweep: SweepRun, loop: asyncio.AbstractEventLoop) -> None:
        self.sweep = sweep
        self.loop = loop

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        done = self.sweep.replayed(load, kind, role)
        if done is not None:
            return done
        fut = asyncio.run_coroutine_threadsafe(self.sweep.step(load, kind, role), self.loop)
        return fut.result()

    def set_loads(self, loads: list[float]) -> None:
        self.sweep.planned = list(loads)


class SweepRun:
    def __init__(self, jr: JobRun) -> None:
        self.jr = jr
        self.job = jr.job
        self.next_idx = 0
        self.total = 0
        self.planned: list[float] | None = None  # auto: rates chosen, sent with the next step
        self.backoff = Backoff(jr.opts.backoff_initial_s, jr.opts.backoff_max_s)
        self.replay = Replay([])

    async def run(self) -> JobOutcome:
        jr, job = self.jr, self.job
        try:
            plan = plan_of(dict(job.spec["plan"]))
            bench = dict(job.spec["bench"])
            if job.spec.get("api_key"):
                bench["api_key"] = job.spec["api_key"]
            self.base = spec_from_job(bench)
        except (KeyError, TypeError, ValueError, ValidationError) as e:
            return await jr.complete("failed", f"invalid sweep spec: {e}")
        self.base, jr.load_note = with_worker_processes(self.base, jr.opts.processes)
        self.total = planned_steps(plan)
        if job.resume is not None:
            up = jr.uploader  # batch numbers stay unique per job: go on after earlier ones
            up.next_batch_no = max(up.next_batch_no, job.resume.first_batch_no)
            try:
                self.replay = Replay(job.resume.completed)
            except ReplayMismatch as e:
                return await jr.complete("failed", str(e), stop_reason=str(e))
            log.info(
                "job %s: attempt %d resumes after %d completed step(s)",
                job.job_id,
                job.attempt,
                len(self.replay),
            )
        side = [
            asyncio.create_task(jr.heartbeats(), name=f"heartbeat-{job.job_id}"),
            asyncio.create_task(jr.cutter(), name=f"cut-{job.job_id}"),
            asyncio.create_task(jr.watch_stop(), name=f"watch-{job.job_id}"),
        ]
        try:
            bridge = _Bridge(self, asyncio.get_running_loop())
            status: CompleteStatus = "succeeded"
            error: str | None = None
            try:
                stop = await asyncio.to_thread(drive, bridge, plan)
                if self.next_idx < len(self.replay):
                    raise ReplayMismatch(
                        f"resume: the plan now ends after step {self.next_idx - 1}, but an "
                        f"earlier attempt completed steps up to {len(self.replay) - 1}"
                    )
            except SweepStopped as e:
                if e.status is None:
                    return jr.drop(jr.uploader.lost or e.reason)
                status, error, stop = e.status, e.error, e.reason
            except ReplayMismatch as e:
                log.error("job %s: %s", job.job_id, e)
                status, error, stop = "failed", str(e), str(e)
            except Exception as e:
                log.exception("job %s: sweep failed", job.job_id)
                status, error, stop = "failed", f"the sweep failed: {describe(e)}", None
            if jr.uploader.lost is not None:
                return jr.drop(jr.uploader.lost)
            log.info("job %s: sweep ends (%s) after %d steps", job.job_id, status, self.next_idx)
            return await jr.complete(status, error, stop_reason=stop)
        finally:
            jr.stop_load()
            for t in side:
                t.cancel()
            for t in side:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    def _check_going(self) -> None:
        jr = self.jr
        if jr.uploader.lost is not None:
            raise SweepStopped(None, jr.uploader.lost)
        if jr.uploader.refused is not None:
            why = f"the server refused result batch {jr.uploader.refused.batch_no}"
            raise SweepStopped("failed", why)  # the completion says the rest (refused_request)
        if jr.cancelled:
            raise SweepStopped("cancelled", f"cancelled after {self.next_idx} step(s)")
        if jr.stopping:
            raise SweepStopped(
                "cancelled",
                f"the worker was stopped after {self.next_idx} step(s)",
                "the worker was stopped during the sweep",
            )

    def replayed(self, load: float, kind: LoadKind, role: str) -> StepSummary | None:
        """The next step's summary when an earlier attempt completed it (on drive's thread;
        the loop does not touch ``next_idx`` meanwhile), else None."""
        idx = self.next_idx
        done = self.replay.summary(idx, load, kind, role)
        if done is not None:
            self.next_idx += 1
            log.info(
                "job %s: step %d replayed (completed on an earlier attempt)", self.job.job_id, idx
            )
        return done

    async def step(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        """Run one step end to end; its summary as the server computed it."""
        jr, job = self.jr, self.job
        self._check_going()
        idx = self.next_idx
        self.next_idx += 1
        req = StepCreate(
            lease_id=job.lease_id,
            step_idx=idx,
            load=None if math.isinf(load) else float(load),
            load_kind=kind,
            role="probe" if role == "probe" else "step",
            planned_loads=self.planned,
        )
        created = await self._call(lambda: jr.client.create_step(job.job_id, req))
        self.planned = None
        run_id = created.run_id
        jr.step_run, jr.step_info, jr.progress = run_id, (idx, self.total), None
        log.info("job %s: step %d of %d (run %s)", job.job_id, idx + 1, self.total, run_id)
        spec = step_spec(self.base, load, kind)
        jr.load = LoadThread(
            spec,
            run_tag=run_id,
            on_record=jr.on_record,
            on_progress=jr.on_progress,
            kernel_stamps=jr.opts.kernel_stamps,
            realtime=jr.opts.realtime,
            dataset_dirs=jr.opts.dataset_dirs,
            allow_link_local=jr.opts.allow_link_local,
        )
        done = await execute(
            spec,
            jr.load_result,
            on_scraper=jr.on_scraper,
            allow_link_local=jr.opts.allow_link_local,
        )
        error: str | None = None
        if done.error is not None:
            error = f"the load failed: {describe(done.error)}"
            log.error("job %s: step %d load failed", job.job_id, idx, exc_info=done.error)
        await jr.cut_all()
        up = jr.uploader
        if not await up.drain(jr.deadline):
            if up.lost is not None:
                raise SweepStopped(None, up.lost)
            if up.refused is None:
                raise SweepStopped(
                    "cancelled", "the worker was stopped", "left spooled at shutdown"
                )
        status, error = jr.final_status(done.result, error)
        if up.refused is not None:  # this step's results did not all arrive: it failed
            status, error = "failed", up.refused.text(jr.spool.kept_path())
        meta = done.meta
        series = (series_to_wire(done.series) or None) if meta is not None else None
        complete = StepComplete(
            lease_id=job.lease_id,
            status=status,
            error=error,
            total_batches=up.sent_batches(),
            run_meta=meta,
            server_metrics=series,
            records=up.recorded[run_id],
        )
        resp = await self._call(lambda: jr.client.complete_step(job.job_id, idx, complete))
        log.info("job %s: step %d %s", job.job_id, idx, resp.status)
        self._check_going()  # a refused batch ends the sweep here
        if status == "cancelled":
            self._check_going()
            raise SweepStopped("cancelled", f"stopped during step {idx}")
        return step_from_dict(resp.summary)

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """One protocol call, retried while the server is unreachable (or briefly refuses);
        a lost lease raises ``SweepStopped`` (the job is dropped)."""
        jr = self.jr
        rejections = 0
        while True:
            try:
                out = await fn()
            except ServerUnreachable as e:
                if jr.stopping:
                    raise SweepStopped("cancelled", "the worker was stopped", str(e)) from None
                delay = self.backoff.next()
                log.info("job %s: unreachable (%s); retry in %.1fs", self.job.job_id, e, delay)
                await asyncio.sleep(delay)
                continue
            except (LeaseLost, NotFound) as e:
                jr.uploader.lose(f"lease lost: {e}")
                raise SweepStopped(None, str(e)) from None
            except (BatchesMissing, AuthError, ProtocolError) as e:
                rejections += 1
                if rejections >= MAX_REJECTIONS:
                    jr.uploader.lose(f"refused {rejections} times: {e}")
                    raise SweepStopped(None, str(e)) from None
                log.warning("job %s: refused: %s", self.job.job_id, e)
                await jr.uploader.drain(jr.deadline)
                await asyncio.sleep(self.backoff.next())
                continue
            self.backoff.reset()
            return out


async def run_sweep(jr: JobRun) -> JobOutcome:
    """``WorkerJobKind`` of a sweep job."""
    return await SweepRun(jr).run()
