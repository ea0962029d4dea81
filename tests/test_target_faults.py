"""Target faults in one run: the simulator injects every fault it knows (HTTP 500, reset
mid-stream, a stall, a malformed line, a server that never answers) among healthy requests.
Each faulty request becomes a per-request error with its precise reason, the run ends within
its time limit, and the healthy requests are timed within the client's fidelity bound.

Single-fault cases over raw sockets (connection refused, non-JSON data lines, an oversized
event, ...) are in tests/test_client.py; a 4xx is here."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pytest

from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from app.targets.simulator.handles import start_simulator_process

TIMEOUT_S = 1.5
MAX_DURATION_S = 90.0  # far above any load's slowness: a run that waits for it is plainly wrong
N = 60

# fault -> (status, a phrase its error must contain)
EXPECTED: dict[str, tuple[RequestStatus, tuple[str, ...]]] = {
    "none": (RequestStatus.OK, ()),
    "error": (RequestStatus.ERROR, ("HTTP 500",)),
    "disconnect": (RequestStatus.ERROR, ("reset", "closed")),
    "stall": (RequestStatus.TIMEOUT, ("timeout", "timed out", "no data")),
    "malformed": (RequestStatus.ERROR, ("non-JSON data line",)),
    "hang": (RequestStatus.TIMEOUT, ("headers",)),
}


def _spec(url: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "tokentrace-sim",
        "input_len": 8,
        "output_len": 12,
        "num_prompts": N,
        "max_concurrency": N,
        "request_timeout_s": TIMEOUT_S,
        "max_duration_s": MAX_DURATION_S,
    }
    return RunSpec(**(base | kw))


@pytest.mark.timeout(180)
def test_every_fault_is_a_precise_per_request_error_and_healthy_timing_holds() -> None:
    cfg = SimConfig(
        ttft_ms=15.0,
        itl_ms=4.0,
        seed=11,
        error_rate=0.12,
        disconnect_rate=0.12,
        stall_rate=0.12,
        malformed_rate=0.12,
        hang_rate=0.12,
    )
    sim = start_simulator_process(cfg)  # its own process: no GIL shared with the client
    try:
        t0 = time.monotonic()
        res = run_load_sync(_spec(sim.base_url), run_tag="faults", handle_sigint=False)
        elapsed = time.monotonic() - t0
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    # the run ends soon after the slowest request's own time limit, not at max_duration_s
    assert elapsed < MAX_DURATION_S / 3, elapsed  # 1.5 s plus start-up on any machine
    assert len(res.records) == N
    seen: dict[str, int] = {}
    errors_ms: list[float] = []
    for r in res.records:
        g = truth[f"faults-{r.index}"]
        fault = g["fault"]
        seen[fault] = seen.get(fault, 0) + 1
        status, phrases = EXPECTED[fault]
        assert r.status is status, (r.index, fault, r.status, r.error)
        if phrases:
            assert r.error and any(p in r.error for p in phrases), (fault, r.error)
            continue
        assert r.error is None and r.output_tokens == 12
        content = [
            t
            for t, k in zip(g["events"]["t_ns"], g["events"]["kind"], strict=True)
            if k == "content"
        ]
        ours = r.event_t_ns[r.event_kind == EventKind.CONTENT] + res.start_mono_ns
        assert len(ours) == len(content) == 12
        diff = (np.asarray(ours) - np.asarray(content)) / 1e6
        # never before the server wrote it; the simulator shares this process, so its own
        # stamp, read once its thread has the GIL back, may follow the kernel's by a switch
        assert np.all(diff >= -sys.getswitchinterval() * 1e3), diff
        errors_ms += diff.tolist()
    assert set(seen) == set(EXPECTED), seen  # every kind of fault actually happened
    assert res.counts["ok"] == seen["none"]
    # the bound of test_client's ground-truth test, 2 x client_lag_bound_ms (the simulator runs
    # apart here; benchmarks/bench_client_fidelity.py measures the client's fidelity closely)
    bound = 2 * _spec("http://x").client_lag_bound_ms
    p50, p99 = np.percentile(errors_ms, [50, 99])
    assert p50 < 1.0 and p99 < bound and max(errors_ms) < bound, (p50, p99, max(errors_ms))
    print(
        f"healthy {seen['none']}/{N}: timing error p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
        f"max {max(errors_ms):.3f} ms; run took {elapsed:.2f} s; faults {seen}"
    )


def test_http_4xx_is_a_per_request_error_naming_the_status() -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=1, seed=1))
    try:
        res = run_load_sync(
            _spec(sim.base_url + "/no-such-prefix", num_prompts=3),
            run_tag="4xx",
            handle_sigint=False,
        )
    finally:
        sim.stop()
    assert [r.status for r in res.records] == [RequestStatus.ERROR] * 3
    for r in res.records:
        assert r.http_status is not None and 400 <= r.http_status < 500
        assert f"HTTP {r.http_status}" in (r.error or "")
