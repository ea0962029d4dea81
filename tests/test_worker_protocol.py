"""The worker against an in-memory protocol fake (tests/worker_fakes.py) and the simulator:
batching, spooling, retries, cancels and lost leases, each in isolation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.client.spec import RunSpec
from app.protocol.wire import CompleteRequest, ResultBatch, WireRequest
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker import capabilities
from app.worker.backoff import Backoff
from app.worker.client import WorkerClient, missing_batches
from app.worker.job import spec_from_job
from app.worker.loop import Worker, WorkerOptions
from app.worker.spool import JobSpool, Spool, StateDirLock
from app.worker.uploader import Uploader
from tests.worker_fakes import FakeServer

pytestmark = pytest.mark.timeout(60)

FAST = WorkerOptions(
    backoff_initial_s=0.05,
    backoff_max_s=0.3,
    batch_interval_s=0.1,
    batch_max_requests=8,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.1,
    poll_interval_s=0.05,
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, output_len=8, seed=1))
    yield s
    s.stop()


def spec(sim: SimulatorThread, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "base_url": sim.base_url,
        "model": "tokentrace-sim",
        "input_len": 16,
        "output_len": 8,
        "num_prompts": 30,
        "max_concurrency": 8,
    }
    out: dict[str, Any] = RunSpec.model_validate(base | kw).model_dump(mode="json")
    return out


def worker(fake: FakeServer, tmp_path: Path, **kw: Any) -> Worker:
    return Worker(
        "http://fake",
        fake.token,
        state_dir=tmp_path / "state",
        options=kw.pop("options", FAST),
        transport=fake.transport,
        **kw,
    )


def test_job_end_to_end_every_request_once(sim: SimulatorThread, tmp_path: Path) -> None:
    fake = FakeServer()
    job = fake.add_job(spec(sim, warmup_requests=2))
    w = worker(fake, tmp_path, labels={"rack": "a"})
    outcome = asyncio.run(w.run_once())
    assert outcome is not None and outcome.status == "succeeded"
    assert fake.registrations[0].capabilities.labels == {"rack": "a"}
    assert sorted(job.requests) == list(range(32))  # 2 warm-ups + 30 measured
    assert set(job.requests.values()) == {1}
    assert set(job.statuses.values()) == {"ok"}
    assert job.completion is not None and job.completion.status == "succeeded"
    assert job.completion.total_batches == len(job.batches) >= 4  # batched, <= 8 per batch
    assert max(job.batches.values()) <= 8
    meta = job.completion.run_meta
    assert meta is not None and meta.load_stats["counts"]["ok"] == 30
    assert list((tmp_path / "state" / "jobs").iterdir()) == []  # spool cleaned up


def test_unlimited_rate_survives_json(sim: SimulatorThread) -> None:
    s = json.loads(RunSpec.model_validate(spec(sim)).model_dump_json())
    assert s["request_rate"] is None  # what pydantic's JSON makes of inf
    assert spec_from_job(s).request_rate == float("inf")


def test_lost_responses_and_outage_store_each_request_once(
    sim: SimulatorThread, tmp_path: Path
) -> None:
    fake = FakeServer(lose_response_for={("results", 0), ("results", 2)})
    job = fake.add_job(spec(sim, num_prompts=40, request_rate=40, arrival="constant"))

    async def main() -> None:
        w = worker(fake, tmp_path)
        task = asyncio.create_task(w.run_once())

        async def until(cond: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 60
            while not cond():
                assert time.monotonic() < deadline and not task.done(), what
                await asyncio.sleep(0.005)

        # the server restarts once the first batch has landed: connections refused until
        # the worker has been refused at least once (on any machine's speed)
        await until(lambda: bool(job.batches), "no batch landed")
        fake.down = True
        await until(lambda: fake.failed_connects > 0, "the worker never tried the server")
        await asyncio.sleep(0.2)
        fake.down = False
        outcome = await task
        assert outcome is not None and outcome.status == "succeeded"

    asyncio.run(main())
    assert fake.failed_connects > 0
    assert job.duplicate_batches >= 2  # the lost acknowledgements were retried
    assert sorted(job.requests) == list(range(40))
    assert set(job.requests.values()) == {1}


def test_cancel_at_heartbeat_keeps_measured_data(sim: SimulatorThread, tmp_path: Path) -> None:
    fake = FakeServer(cancel_after_heartbeats=3)
    job = fake.add_job(spec(sim, num_prompts=200, request_rate=20, arrival="constant"))
    outcome = asyncio.run(worker(fake, tmp_path).run_once())
    assert outcome is not None and outcome.status == "cancelled"
    assert job.completion is not None and job.completion.status == "cancelled"
    assert 0 < len(job.requests) < 200
    assert set(job.requests.values()) == {1}
    assert job.progress and job.progress[-1].planned == 200


def test_lease_lost_drops_the_job(sim: SimulatorThread, tmp_path: Path) -> None:
    fake = FakeServer(heartbeat_409=True)
    job = fake.add_job(spec(sim, num_prompts=200, request_rate=20, arrival="constant"))
    outcome = asyncio.run(worker(fake, tmp_path).run_once())
    assert outcome is not None and outcome.status is None
    assert job.completion is None
    assert list((tmp_path / "state" / "jobs").iterdir()) == []


def test_invalid_spec_completes_failed(tmp_path: Path) -> None:
    fake = FakeServer()
    job = fake.add_job({"base_url": "ftp://nope", "model": "m"})
    outcome = asyncio.run(worker(fake, tmp_path).run_once())
    assert outcome is not None and outcome.status == "failed"
    assert job.completion is not None and "base_url" in (job.completion.error or "")
    assert job.completion.total_batches == 0


def test_all_requests_failing_completes_failed(tmp_path: Path) -> None:
    fake = FakeServer()
    job = fake.add_job(
        RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=3).model_dump(mode="json")
    )
    outcome = asyncio.run(worker(fake, tmp_path).run_once())
    assert outcome is not None and outcome.status == "failed"
    assert job.completion is not None and "no measured request succeeded" in (
        job.completion.error or ""
    )
    assert sorted(job.requests) == [0, 1, 2]


def _spooled_job(fake: FakeServer, sim: SimulatorThread, root: Path) -> tuple[Any, JobSpool]:
    job = fake.add_job(spec(sim, num_prompts=3))
    leased = fake.lease_job(job)
    js = Spool(root).open_job(leased)
    from app.domain import RequestRecord, RequestStatus

    for no in range(3):
        rec = RequestRecord(index=no, scheduled_ns=0, sent_ns=1, end_ns=2, status=RequestStatus.OK)
        js.write(
            ResultBatch(
                lease_id=leased.lease_id, batch_no=no, requests=[WireRequest.from_record(rec)]
            )
        )
    return job, js


def test_spool_left_by_a_crash_is_resent(sim: SimulatorThread, tmp_path: Path) -> None:
    fake = FakeServer()
    root = tmp_path / "state"
    job, js = _spooled_job(fake, sim, root)
    js.write_complete(
        CompleteRequest(lease_id=js.job.lease_id, status="succeeded", total_batches=3)
    )
    job.batches[1] = 1  # batch 1 had arrived; its acknowledgement had not
    job.requests[1] = 1
    outcome = asyncio.run(worker(fake, tmp_path).run_once())
    assert outcome is None  # no new work; the leftovers were handled first
    assert sorted(job.requests) == [0, 1, 2] and set(job.requests.values()) == {1}
    assert job.duplicate_batches == 1
    assert job.completion is not None and job.completion.total_batches == 3
    assert not js.path.exists()


def test_batches_missing_at_complete_are_resent(sim: SimulatorThread, tmp_path: Path) -> None:
    fake = FakeServer()
    job, js = _spooled_job(fake, sim, tmp_path)

    async def main() -> None:
        async with WorkerClient("http://fake", "tok", transport=fake.transport) as c:
            up = Uploader(c, js, Backoff(0.01, 0.05))
            req = CompleteRequest(lease_id=js.job.lease_id, status="succeeded", total_batches=3)
            resp = await up.complete(req)  # nothing sent yet: the server names 0, 1, 2
            await up.close()
            assert resp is not None and resp.state == "succeeded"

    asyncio.run(main())
    assert sorted(job.batches) == [0, 1, 2]


def test_unreachable_server_backs_off_without_crashing(tmp_path: Path) -> None:
    fake = FakeServer(down=True)

    async def main() -> None:
        stop = asyncio.Event()
        w = worker(fake, tmp_path)
        task = asyncio.create_task(w.run_forever(stop))
        await asyncio.sleep(1.0)
        assert not task.done()
        attempts = fake.failed_connects
        assert 3 <= attempts <= 30  # backoff: not a busy loop
        fake.down = False
        for _ in range(100):
            if w.worker_id is not None:
                break
            await asyncio.sleep(0.05)
        assert w.worker_id == "w1"
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())


def test_backoff_is_capped_with_jitter() -> None:
    b = Backoff(0.5, 4.0)
    delays = [b.next() for _ in range(8)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert delays[-1] >= 2.0
    b.reset()
    assert b.next() <= 0.5


def test_missing_batches_parsing() -> None:
    assert missing_batches("batches missing: [3, 4] (of total_batches=5); upload") == [3, 4]
    assert missing_batches({"missing_batches": [1]}) == [1]
    assert missing_batches("lease lost") is None


def test_state_dir_lock_is_exclusive(tmp_path: Path) -> None:
    a = StateDirLock.acquire(tmp_path, "k")
    b = StateDirLock.acquire(tmp_path, "k")
    assert a.path != b.path and a.path.name == "worker-k" and b.path.name == "worker-k-2"
    with pytest.raises(RuntimeError):
        StateDirLock.acquire(a.path, "", exact=True)
    a.release()
    c = StateDirLock.acquire(tmp_path, "k")  # a restarted worker finds its spool again
    assert c.path == a.path
    b.release()
    c.release()


def test_capabilities_without_and_with_nvml() -> None:
    caps = capabilities.collect({"k": "v"})
    assert caps.hostname and caps.labels == {"k": "v"}
    assert caps.cpu_count and caps.cpu_count >= 1

    class Mem:
        total = 80 * 1024**3

    nvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: Mem(),
    )
    gpus = capabilities.gpus(nvml)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_total_mb == 80 * 1024 and gpus[0].cuda_version == "12.4"
    assert gpus[1].driver_version == "550.54" and gpus[1].uuid == "GPU-1"

    def broken() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    assert capabilities.gpus(SimpleNamespace(nvmlInit=broken)) == []


def test_a_cut_still_being_spooled_is_waited_for_before_completing(
    sim: SimulatorThread, tmp_path: Path
) -> None:
    """The cutter has taken the last records and is still writing their batch to the spool
    when the load ends: the completion waits for that batch (it is numbered, written and sent)
    instead of declaring a batch that was not spooled yet and losing the job."""
    import threading

    from app.domain import RequestRecord, RequestStatus
    from app.worker.job import JobOptions, JobRun

    fake = FakeServer()
    job = fake.add_job(spec(sim, num_prompts=4))
    leased = fake.lease_job(job)
    js = Spool(tmp_path / "state").open_job(leased)
    in_write, release = threading.Event(), threading.Event()
    write = js.write

    def slow_write(batch: ResultBatch) -> None:
        in_write.set()
        release.wait(5)
        write(batch)

    js.write = slow_write  # type: ignore[method-assign]

    async def main() -> Any:
        async with WorkerClient("http://fake", "tok", transport=fake.transport) as c:
            jr = JobRun(c, js, JobOptions(backoff_initial_s=0.01), asyncio.Event())
            jr.uploader.start()
            for i in range(4):
                jr.records.append(
                    RequestRecord(
                        index=i, scheduled_ns=0, sent_ns=1, end_ns=2, status=RequestStatus.OK
                    )
                )
            cutter = asyncio.create_task(jr.cut())  # as the cutter task does
            await asyncio.to_thread(in_write.wait, 5)
            assert not jr.records  # taken, not yet spooled
            ending = asyncio.create_task(jr.cut_all())
            await asyncio.sleep(0.05)
            assert not ending.done()  # waits for the cut in flight
            release.set()
            await asyncio.gather(cutter, ending)
            outcome = await jr.complete("succeeded", None)
            await jr.uploader.close()
            return outcome

    outcome = asyncio.run(main())
    assert outcome.status == "succeeded"
    assert sorted(job.requests) == [0, 1, 2, 3]
    assert job.completion is not None and job.completion.total_batches == 1
