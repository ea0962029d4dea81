"""The load thread's scheduling: real-time priority on request, and CPU waits measured and noted.

Real threads, real processes and the real simulator over loopback. Tests that need Linux
real-time scheduling skip (with the reason) where the OS refuses it; CPU-contention tests need
two CPUs (the simulator runs on the other one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from app.cli.main import main
from app.client.runner import run_load_sync
from app.client.sched import (
    NORMAL,
    CpuWait,
    RealtimeRefused,
    check_realtime,
    realtime_priority,
)
from app.client.spec import RunSpec
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process, start_simulator_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduler only")


def _realtime_refusal() -> str | None:
    try:
        check_realtime()
    except RealtimeRefused as e:
        return str(e)
    return None


needs_realtime = pytest.mark.skipif(
    _realtime_refusal() is not None, reason=f"real-time scheduling refused: {_realtime_refusal()}"
)
needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
    reason="needs two CPUs: the simulator runs on one, the client and a competitor on the other",
)


def _policy() -> int:
    return os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


def test_disabled_changes_nothing() -> None:
    before = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    with realtime_priority(False) as s:
        assert s == NORMAL and s.as_dict() == {"policy": "normal", "priority": 0}
        if before is not None:
            assert os.sched_getscheduler(0) == before


@linux
@needs_realtime
def test_realtime_is_per_thread_not_inherited_and_restored() -> None:
    assert _policy() == os.SCHED_OTHER
    seen: dict[str, int] = {}
    with realtime_priority(True) as s:
        assert s.policy == "realtime" and s.priority == 1
        assert _policy() == os.SCHED_FIFO
        assert os.sched_getparam(0).sched_priority == 1
        # a thread started meanwhile is not real-time (reset on fork/clone)
        t = threading.Thread(target=lambda: seen.setdefault("child", _policy()))
        t.start()
        t.join()
        # nor is a child process
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        seen["process"] = int(out)
    assert seen == {"child": os.SCHED_OTHER, "process": os.SCHED_OTHER}
    assert _policy() == os.SCHED_OTHER


@linux
def test_refusal_is_a_clear_error_and_cli_exits_2() -> None:
    """A process that may not use real-time scheduling is refused: the CLI exits 2 with one
    line saying why, before anything is sent."""
    # the child gets RLIMIT_RTPRIO 0 (what an unprivileged user has) and, run as root, loses
    # CAP_SYS_NICE (dropped from the bounding set before exec)
    code = (
        "import sys\n"
        "from app.cli.main import main\n"
        "sys.exit(main(['bench', '--base-url', 'http://127.0.0.1:9', '--model', 'm', "
        "'--no-save', '--realtime']))\n"
    )

    def drop_sys_nice() -> None:
        import ctypes
        import resource

        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        libc = ctypes.CDLL(None, use_errno=True)
        # PR_CAPBSET_DROP, CAP_SYS_NICE; only root may drop it, and only root has it
        if libc.prctl(24, 23, 0, 0, 0) != 0 and os.geteuid() == 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")

    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        preexec_fn=drop_sys_nice,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].count("--realtime") == 1, res.stderr
    assert "CAP_SYS_NICE" in lines[0]


def test_cpu_wait_reads_and_grows_under_contention() -> None:
    w = CpuWait()
    if not w.available:
        pytest.skip("this kernel does not expose /proc/thread-self/schedstat")
    first = w.read()
    assert first is not None and first >= 0
    if not hasattr(os, "sched_setaffinity"):
        return
    old = os.sched_getaffinity(0)
    cpu = min(old)
    with _competitor(cpu):
        os.sched_setaffinity(0, {cpu})
        try:
            t_end = time.monotonic() + 0.4
            while time.monotonic() < t_end:  # runnable all along, sharing the CPU
                pass
        finally:
            os.sched_setaffinity(0, old)
    waited = (w.read() or 0) - first
    w.close()
    assert waited > 20_000_000, f"waited only {waited / 1e6:.2f} ms for a shared CPU"


@contextmanager
def _competitor(cpu: int) -> Iterator[None]:
    """A busy process pinned to ``cpu``."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\n"
            "t = time.monotonic() + 60\nwhile time.monotonic() < t: pass\n",
        ]
    )
    time.sleep(0.2)  # let it start spinning
    try:
        yield
    finally:
        p.kill()
        p.wait()


def _run_pinned(base_url: str, cpu: int, *, realtime: bool, streams: int = 32) -> object:
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        spec = RunSpec(
            base_url=base_url,
            model="sim",
            input_len=16,
            output_len=60,
            num_prompts=streams,
            max_concurrency=streams,
            request_timeout_s=60,
        )
        return run_load_sync(
            spec, run_tag="rt" + uuid.uuid4().hex[:6], kernel_stamps=False, realtime=realtime
        )
    finally:
        os.sched_setaffinity(0, old)


def _contended_runs(*, realtime: bool) -> list[Any]:
    """A busy process shares the client's CPU; the simulator runs on another CPU. Returns the
    normal run and, with ``realtime``, a real-time run under the same contention."""
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, sim_cpu = cpus[0], cpus[1]
    cfg = SimConfig(ttft_ms=20, itl_ms=10, output_len=60)
    with start_simulator_process(cfg, cpus={sim_cpu}) as sim, _competitor(client_cpu):
        runs = [_run_pinned(sim.base_url, client_cpu, realtime=False)]
        if realtime:
            runs.append(_run_pinned(sim.base_url, client_cpu, realtime=True))
    return runs


@linux
@needs_two_cpus
def test_contention_is_measured_and_noted() -> None:
    (normal,) = _contended_runs(realtime=False)
    assert normal.scheduling.policy == "normal"
    total = normal.cpu_wait_total_ms
    assert total is not None and total > 5, total
    assert normal.cpu_wait.max_ms is not None and normal.cpu_wait.n > 10
    notes = " ".join(normal.notes)
    assert "waited" in notes and "for a CPU" in notes and "user-space receive stamps" in notes
    assert normal.counts["ok"] == 32


@linux
@needs_two_cpus
@needs_realtime
def test_realtime_avoids_the_contention() -> None:
    normal, rt = _contended_runs(realtime=True)
    assert rt.scheduling.policy == "realtime" and rt.counts["ok"] == 32
    total = normal.cpu_wait_total_ms
    assert total is not None and total > 5, total
    # one run, one machine: compare the ratio, not wall-clock figures
    assert (rt.cpu_wait_total_ms or 0.0) < total / 4, (rt.cpu_wait_total_ms, total)


class _ScriptedWait:
    """A ``CpuWait`` that returns scripted cumulative run_delay values (ns)."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def read(self) -> int | None:
        return self.values.pop(0)

    def close(self) -> None:
        pass


def test_cpu_wait_accounting_by_hand() -> None:
    """Cumulative run_delay 1.0, 1.2, 3.7, 3.7 ms at start and three ticks: per-tick waits
    0.2, 2.5 and 0 ms, 2.7 ms in all; the 2.5 ms tick (>= 1 ms) is noted."""
    from app.client import load_run
    from app.client.http_request import parse_target
    from app.client.run_result import load_result
    from app.client.tokenizer import BuiltinTokenizer

    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=1)
    r = load_run.LoadRun(
        spec, "t", BuiltinTokenizer(), parse_target(spec.base_url), None, None, False
    )
    r.cpu_wait = _ScriptedWait([1_200_000, 3_700_000, 3_700_000])  # type: ignore[assignment]
    r.cpu_wait_first = r.cpu_wait_last = 1_000_000
    for _ in range(3):
        r.sample_cpu_wait()
    assert r.cpu_wait_ticks == [200_000, 2_500_000, 0]
    res = load_result(r, 10_000_000)
    assert res.cpu_wait_total_ms == 2.7
    assert res.cpu_wait.n == 3 and res.cpu_wait.max_ms == 2.5 and res.cpu_wait.p50_ms == 0.2
    assert (
        "the load thread waited 2.7 ms in all for a CPU that other tasks held (longest 2.5 ms "
        "within one 5 ms tick): user-space receive stamps taken then are late by up to that "
        "much" in " ".join(res.notes)
    )
    # below 1 ms within every tick: no note
    r.cpu_wait_ticks = [900_000, 0]
    assert not any("for a CPU" in n for n in load_result(r, 10_000_000).notes)


def test_client_health_line_by_hand() -> None:
    from app.services.client_health import client_health

    report = {
        "load": {
            "scheduling": {"policy": "realtime", "priority": 1},
            "send_lag_ms": {"n": 3, "p50_ms": 0.1, "p99_ms": 0.25, "max_ms": 0.3},
            "loop_lag_ms": {"n": 9, "p50_ms": 0.2, "p99_ms": 1.234, "max_ms": 2.0},
            "cpu_wait_total_ms": 2.7,
            "cpu_wait_ms": {"n": 3, "p50_ms": 0.2, "p99_ms": 2.5, "max_ms": 2.5},
            "read_delay_ms": {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None},
        }
    }
    assert client_health(report) == [
        "scheduling realtime",
        "send lag p99 0.25 ms (max 0.30 ms)",
        "event-loop lag p99 1.23 ms (max 2.00 ms)",
        "waited for a CPU 2.70 ms in all (longest 2.50 ms)",
    ]
    assert client_health({"load": None}) == [] and client_health({}) == []


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    handle = start_simulator_thread(SimConfig(ttft_ms=10, itl_ms=2, seed=5))
    try:
        yield handle.base_url
    finally:
        handle.stop()


def test_cli_unsaved_json_report_has_client_health(
    sim_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--no-save --json`` with the default (infinite) rate prints strict JSON, with the
    clock, the scheduling and the CPU wait of the run."""
    import json

    rc = main(
        [
            "bench",
            "--base-url",
            sim_url,
            "--model",
            "sim",
            "--num-prompts",
            "6",
            "--output-len",
            "8",
            "--input-len",
            "16",
            "--no-save",
            "--json",
            "--clock",
            "userspace",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spec"]["request_rate"] == "inf"
    assert report["clock_source"] == "userspace"
    load = report["load"]
    assert load["scheduling"] == {"policy": "normal", "priority": 0}
    if CpuWait().available:
        assert load["cpu_wait_total_ms"] >= 0 and load["cpu_wait_ms"]["n"] >= 1


@needs_realtime
def test_cli_realtime_run_is_recorded(sim_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "--base-url",
            sim_url,
            "--model",
            "sim",
            "--num-prompts",
            "4",
            "--output-len",
            "8",
            "--no-save",
            "--realtime",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "client: scheduling realtime" in out and "event-loop lag p99" in out
    assert _policy() == os.SCHED_OTHER  # given back after the run


def test_cli_realtime_with_server_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "--base-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--server",
            "http://127.0.0.1:1",
            "--realtime",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--realtime" in err[0] and "worker" in err[0]


@needs_realtime
def test_worker_load_thread_runs_at_realtime_and_control_thread_does_not(sim_url: str) -> None:
    """A worker started with --realtime runs each load's thread at SCHED_FIFO; its own control
    loop (heartbeats, uploads) keeps normal scheduling."""
    import asyncio

    from app.worker.load_thread import LoadThread

    spec = RunSpec(base_url=sim_url, model="sim", num_prompts=3, output_len=6, input_len=16)
    records: list[object] = []

    async def go() -> object:
        lt = LoadThread(
            spec,
            run_tag="w" + uuid.uuid4().hex[:6],
            on_record=records.append,
            on_progress=lambda p: None,
            realtime=True,
        ).start()
        res = await lt.result()
        lt.join(5)
        return res

    res = asyncio.run(go())
    assert res.scheduling.policy == "realtime"  # type: ignore[attr-defined]
    assert len(records) == 3 and _policy() == os.SCHED_OTHER
