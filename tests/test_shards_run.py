"""One run over several load processes (issue 26 parts 2-3): real child processes against
the simulator on loopback. Their records come back as one run with global indices, each
naming its process; the per-process figures and the run's send lag are recomputed here
from the raw records; a process that dies leaves its requests lost (said, the run
partial), and a stop reaches every process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.analysis.trust import run_status, tally
from app.client import eventloop
from app.client.execute import load_stats, outcome_status
from app.client.load_result import LoadResult
from app.client.shards.load import run_load
from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus, RunStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=12, seed=5))
    yield s
    s.stop()


def _spec(url: str, **kw: object) -> RunSpec:
    base: dict[str, object] = {
        "base_url": url, "model": "m", "num_prompts": 24, "max_concurrency": 4,
        "output_len": 12, "input_len": 16, "processes": 2, "scrape_metrics": False,
        "seed": 3, "request_timeout_s": 30.0,
    }  # fmt: skip
    return RunSpec.model_validate(base | kw)


def _children() -> dict[int, int]:
    """This process's live load processes: their number -> pid (from their command line)."""
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"app.client.shards" in argv and stat.split()[2] != "Z":
            out[int(argv[argv.index(b"app.client.shards") + 2])] = int(d.name)
    return out


def _send_lag_ns(r: RequestRecord) -> int:
    assert r.sent_ns is not None and r.queued_ns is not None
    return r.sent_ns - r.scheduled_ns - r.queued_ns - (r.connect_ns or 0) - (r.tls_ns or 0)


def test_two_processes_one_run(sim: SimulatorThread) -> None:
    spec = _spec(sim.base_url, warmup_requests=3)
    seen: list[int] = []
    res: LoadResult = eventloop.run(
        run_load(spec, run_tag="t", on_record=lambda r: seen.append(r.index))
    )
    assert not _children()  # every process ended
    recs = res.records
    # global indices: warm-ups 0..2, measured 3..26, each once; on_record saw each
    assert [r.index for r in recs] == list(range(27)) and sorted(seen) == list(range(27))
    assert all(r.status is RequestStatus.OK for r in recs)
    # dealt by hand: 4 slots over 2 processes (2, 2); measured i with slot i mod 4; warm-ups
    # i mod 2
    assert [r.process for r in recs if r.warmup] == [0, 1, 0]
    assert [r.process for r in recs if not r.warmup] == [(i % 4) % 2 for i in range(24)]
    assert res.counts["planned"] == 24 and res.counts["sent"] == 24 and res.counts["lost"] == 0
    assert res.counts["ok"] == 24 and res.counts["warmup"] == 3
    # the measured phase starts together, after every warm-up
    warm_end = max(r.end_ns or 0 for r in recs if r.warmup)
    assert res.measure_start_ns >= warm_end
    assert min(r.sent_ns or 0 for r in recs if not r.warmup) >= res.measure_start_ns
    # send lag over the merged records, recomputed (non-burst: requests that waited)
    lags = np.array(
        [_send_lag_ns(r) for r in recs if not r.warmup and (r.queued_ns or 0) > 0], np.float64
    )
    assert res.send_lag.n == lags.size
    assert res.send_lag.p99_ms == pytest.approx(np.percentile(lags, 99) / 1e6)
    # per-process figures, recomputed from the records
    rows = {int(str(p["process"])): p for p in res.processes}
    assert set(rows) == {0, 1}
    for p, row in rows.items():
        mine = [r for r in recs if r.process == p and not r.warmup]
        assert row["requests"] == len(mine) == 12 and row["lost"] == 0
        tokens = sum(r.output_tokens or 0 for r in mine)
        assert row["output_tokens"] == tokens == 12 * 12
        span = (max(r.end_ns or 0 for r in mine) - res.measure_start_ns) / 1e9
        assert row["tokens_per_s"] == pytest.approx(tokens / span)
        first = min(mine, key=lambda r: (r.scheduled_ns + (r.queued_ns or 0), r.index))
        assert row["start_skew_ms"] == pytest.approx(_send_lag_ns(first) / 1e6)
        wake = row["wake_us"]
        assert isinstance(wake, dict) and set(wake) == {"run", "measure"}
        assert all(v >= 0 for v in wake.values())  # never before the common instant
    stats = load_stats(res)
    assert [p["process"] for p in stats["processes"]] == [0, 1]
    assert outcome_status(res) is RunStatus.SUCCEEDED


@pytest.mark.slow
def test_a_dead_process_leaves_its_requests_lost(sim: SimulatorThread) -> None:
    """Process 1 is killed when its first record arrives: its other requests are lost,
    counted and said; the run is partial; process 0's run is whole."""
    slow = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=10, output_len=10, seed=1))
    try:
        spec = _spec(slow.base_url, num_prompts=16, max_concurrency=2, output_len=10)
        killed: list[int] = []

        def on_record(r: RequestRecord) -> None:
            if r.process == 1 and not killed:
                pid = _children()[1]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        res: LoadResult = eventloop.run(run_load(spec, run_tag="d", on_record=on_record))
    finally:
        slow.stop()
    assert killed and not _children()
    got1 = [r for r in res.records if r.process == 1]
    assert 1 <= len(got1) < 8
    assert res.counts["lost"] == 8 - len(got1)
    assert len([r for r in res.records if r.process == 0]) == 8
    row1 = next(p for p in res.processes if p["process"] == 1)
    assert row1["lost"] == 8 - len(got1) and "code -9" in str(row1["error"])
    assert any(
        n.startswith("process 1 ended before its load did") and f"{8 - len(got1)} of its 8" in n
        for n in res.notes
    )
    assert outcome_status(res) is RunStatus.PARTIAL
    assert run_status(tally(res.records), stopped=False, max_error_rate=0.05) is not (
        RunStatus.PARTIAL
    )  # the records alone look whole: the lost count is what says otherwise


@pytest.mark.slow
def test_a_stop_reaches_every_process(sim: SimulatorThread) -> None:
    slow = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=20, output_len=20, seed=2))
    try:
        spec = _spec(slow.base_url, num_prompts=40, max_concurrency=2, output_len=20)

        async def main() -> LoadResult:
            stop = asyncio.Event()
            per: dict[int, int] = {}

            def on_record(r: RequestRecord) -> None:
                per[r.process or 0] = per.get(r.process or 0, 0) + 1
                if len(per) == 2:  # both processes are running
                    stop.set()

            return await run_load(spec, run_tag="s", stop=stop, on_record=on_record)

        res: LoadResult = eventloop.run(main())
    finally:
        slow.stop()
    assert not _children()
    assert res.stopped == "stopped" and res.counts["lost"] == 0
    assert res.counts["unsent"] > 0
    assert {p["process"] for p in res.processes} == {0, 1}
    assert all(p["error"] is None for p in res.processes)
    assert outcome_status(res) is RunStatus.CANCELLED


def test_a_stop_before_the_common_start_sends_nothing(sim: SimulatorThread) -> None:
    async def main() -> LoadResult:
        stop = asyncio.Event()
        stop.set()
        return await run_load(_spec(sim.base_url), run_tag="b", stop=stop)

    res: LoadResult = eventloop.run(main())
    assert not _children()
    assert res.stopped == "stopped" and res.counts["sent"] == 0 and res.records == []
    assert res.counts["unsent"] == 24 and res.counts["lost"] == 0


@pytest.mark.slow
def test_processes_not_ready_in_time_fail_naming_how_many(
    sim: SimulatorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.client.shards import coordinator

    monkeypatch.setattr(coordinator, "READY_TIMEOUT_S", 0.001)
    with pytest.raises(RuntimeError, match=r"processes: 0 of 2 load processes were ready"):
        eventloop.run(run_load(_spec(sim.base_url), run_tag="r"))
    assert not _children()


@pytest.mark.slow
def test_sessions_dealt_over_processes(sim: SimulatorThread, tmp_path: Path) -> None:
    """Each session's turns all come from one process; sessions keep their global numbers;
    the measured indices are contiguous after the warm-ups."""
    import json

    convs = [[f"s{s} t{k}" for k in range(1 + s % 3)] for s in range(7)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    spec = _spec(
        sim.base_url, dataset="jsonl", dataset_path=str(path), multi_turn=True, num_prompts=5,
        warmup_requests=2, output_len=3,
    )  # fmt: skip
    res: LoadResult = eventloop.run(run_load(spec, run_tag="m"))
    measured = [r for r in res.records if not r.warmup]
    assert [r.index for r in res.records] == list(range(2 + len(measured)))
    assert all(r.status is RequestStatus.OK for r in res.records)
    by_session: dict[int, set[int | None]] = {}
    for r in measured:
        assert r.session is not None
        by_session.setdefault(r.session, set()).add(r.process)
    assert sorted(by_session) == [0, 1, 2, 3, 4]
    # 4 slots over 2 processes: session s with slot s mod 4 -> process (s mod 4) mod 2
    assert by_session == {s: {(s % 4) % 2} for s in range(5)}
    assert res.counts["planned"] == len(measured) == res.counts["ok"]
