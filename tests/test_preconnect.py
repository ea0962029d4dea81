"""Connections opened ahead of an agent's fan-out (``app.client.preconnect``): a request
with several children opens, as it is sent, an idle connection for each child beyond the
first, so where its reply ends every child is sent on an open connection, none after a
connect. Over real loopback sockets."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.services.client_health import client_health
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.test_client import run


def _trace(tmp_path: Path, fan_out: int) -> str:
    lines: list[dict[str, Any]] = [
        {"session_id": "s", "request_id": "plan", "parent_ids": [], "prompt": "p", "output_len": 6}
    ]
    for i in range(fan_out):
        kid = {"session_id": "s", "request_id": f"k{i}", "parent_ids": ["plan"], "prompt": "k"}
        lines.append(kid | {"output_len": 2})
    lines.append({"session_id": "t", "request_id": "solo", "parent_ids": [], "prompt": "q"})
    p = tmp_path / "fan.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(p)


def _spec(url: str, path: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "sim",
        "dataset": "agentic",
        "dataset_path": path,
        "output_len": 2,
        "request_timeout_s": 10.0,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """The simulator (it keeps connections alive), each token 4 ms apart."""
    handle = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=4, seed=3))
    try:
        yield handle.base_url
    finally:
        handle.stop()


def test_a_fan_out_finds_a_connection_open_for_each_child(tmp_path: Path, sim_url: str) -> None:
    path = _trace(tmp_path, fan_out=3)
    res = run(run_load(_spec(sim_url, path), run_tag="f"))
    recs = sorted((r for r in res.records if not r.warmup), key=lambda r: r.index)
    assert [r.status for r in recs] == [RequestStatus.OK] * 5
    kids = [r for r in recs if r.agent is not None and r.agent.parents]
    assert len(kids) == 3
    # no child waited for a connect: each went out on an open connection
    assert all(r.conn_reused for r in kids), [(r.index, r.conn_reused) for r in kids]
    c = res.connections
    # plan's and solo's own, plus two opened ahead for plan's 3 children
    assert (c["opened"], c["opened_ahead"], c["reused"]) == (4, 2, 3)
    line = client_health({"load": {"connections": c}})
    assert line == ["connections keep-alive: 4 opened (2 ahead of an agent's fan-out), "
                    "3 requests on a reused one"]  # fmt: skip


def test_no_connection_opened_ahead_without_a_fan_out_or_keep_alive(
    tmp_path: Path, sim_url: str
) -> None:
    chain = _trace(tmp_path, fan_out=1)
    res = run(run_load(_spec(sim_url, chain), run_tag="n"))
    assert res.connections["opened_ahead"] == 0 and res.counts["ok"] == 3
    fan = _trace(tmp_path, fan_out=2)
    res = run(run_load(_spec(sim_url, fan, connection_mode="new"), run_tag="m"))
    assert res.connections["opened_ahead"] == 0 and res.counts["ok"] == 4
    assert res.connections["opened"] == 4  # every request on its own connection


def test_a_connection_opened_ahead_to_a_dead_address_is_dropped() -> None:
    """A connect that fails leaves nothing behind: the pool counts it opened and closed."""
    from app.client.connpool import ConnPool
    from app.client.preconnect import open_ahead

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    addr = sock.getsockname()
    sock.close()  # nothing listens there now

    async def go() -> tuple[int, ConnPool]:
        pool = ConnPool(keep_alive=True, bound=8)
        n = await open_ahead(
            pool, addr, socket.AF_INET, 3, kernel=True, tx=True, timeout_s=2.0
        )  # fmt: skip
        return n, pool

    n, pool = run(go())
    assert n == 0 and pool.open == 0 and pool.idle == 0
    assert pool.stats.opened == 3 and pool.stats.opened_ahead == 0


def test_connections_asked_ahead_count_against_the_runs_bound() -> None:
    """Two fan-outs asking before either connect starts: the second is refused what would
    pass the bound (the pending ones count as open)."""
    from app.client.connpool import ConnPool
    from app.client.preconnect import Opener

    srv = socket.create_server(("127.0.0.1", 0))
    addr = srv.getsockname()

    async def go() -> tuple[int, int, int]:
        pool = ConnPool(keep_alive=True, bound=3)
        opener = Opener(pool, kernel_stamps=False, timeout_s=2.0)
        for _ in range(2):  # as LoadRun.open_ahead bounds each ask
            opener.open(addr, socket.AF_INET, min(2, 3 - pool.open - opener.pending))
        asked = opener.pending
        while opener.tasks:
            await asyncio.sleep(0.001)
        idle = pool.idle
        pool.close_all()
        return asked, idle, opener.pending

    try:
        assert run(go()) == (3, 3, 0)
    finally:
        srv.close()
