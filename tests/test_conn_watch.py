"""A kept-alive connection is registered with the event loop once, for its life
(``Conn.watch``), not once per request; while it is idle, its read events tell whether the
server closed it (no ``MSG_PEEK`` before reuse), also for a connection reserved ahead of its
request's send."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from typing import Any

import pytest

from app.client import connpool, eventloop
from app.client.connpool import Conn, ConnPool
from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process


def _spec(base_url: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": base_url,
        "model": "m",
        "input_len": 16,
        "output_len": 4,
        "num_prompts": 24,
        "max_concurrency": 3,
        "request_timeout_s": 10.0,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


def test_one_selector_registration_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """24 requests on 3 kept-alive connections: the load loop's selector registers each
    client socket for reading once, and the run's answers are all measured."""
    registered: Counter[int] = Counter()
    unregistered: Counter[int] = Counter()
    real_register = eventloop.StampingSelector.register
    real_unregister = eventloop.StampingSelector.unregister

    def register(self: Any, fileobj: Any, events: int, data: Any = None) -> Any:
        if events & 1:  # EVENT_READ
            registered[fileobj if isinstance(fileobj, int) else fileobj.fileno()] += 1
        return real_register(self, fileobj, events, data)

    def unregister(self: Any, fileobj: Any) -> Any:
        unregistered[fileobj if isinstance(fileobj, int) else fileobj.fileno()] += 1
        return real_unregister(self, fileobj)

    monkeypatch.setattr(eventloop.StampingSelector, "register", register)
    monkeypatch.setattr(eventloop.StampingSelector, "unregister", unregister)
    peeks = Counter[str]()
    real_peek = Conn.closed_by_peer

    def peek(self: Conn) -> bool:
        peeks["n"] += 1
        return real_peek(self)

    monkeypatch.setattr(Conn, "closed_by_peer", peek)
    with start_simulator_process(SimConfig(ttft_ms=1, itl_ms=1, seed=3)) as sim:
        res = run_load_sync(_spec(sim.base_url), run_tag="watch", handle_sigint=False)
    assert res.counts["ok"] == 24, [r.error for r in res.records]
    assert (res.connections["opened"], res.connections["reused"]) == (3, 21)
    # the 3 sockets (and the loop's own wake-up pipe) are each registered once
    assert len(registered) >= 3 and max(registered.values()) == 1, registered
    # unregistered twice at most: its connect's writer, then at its close
    assert max(unregistered.values(), default=0) <= 2, unregistered
    assert peeks["n"] == 0  # a watched connection is never peeked before reuse


def _pair() -> tuple[socket.socket, socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    srv.close()
    cli.setblocking(False)
    return cli, peer


def test_idle_connection_closed_by_the_server_is_dropped_before_reuse() -> None:
    """The server closes an idle, watched connection: its read event marks it dead and
    unregisters it; the pool then drops it (counted as closed while idle) and a busy
    connection's events still go to its request's callback."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        pool = ConnPool(keep_alive=True, bound=2)
        cli, peer = _pair()
        busy_cli, busy_peer = _pair()
        conn = Conn(pool.new_id(), cli, socket.AF_INET, key="k")
        busy = Conn(pool.new_id(), busy_cli, socket.AF_INET, key="b")
        calls: list[bytes] = []

        def reader() -> None:
            calls.append(busy_cli.recv(100))

        conn.watch(loop, lambda: pytest.fail("an idle connection has no reader"))
        conn.unwatch()
        busy.watch(loop, reader)
        pool.give(conn)
        peer.close()
        busy_peer.sendall(b"answer")
        for _ in range(50):
            await asyncio.sleep(0.01)
            if conn.dead and calls:
                break
        assert conn.dead and conn.loop is None
        assert calls == [b"answer"] and not busy.dead
        assert pool.take("k") is None
        assert pool.stats.closed_idle == 1 and pool.open == 1
        busy.close()
        assert busy.loop is None
        busy_peer.close()

    eventloop.run(go())


def test_watched_idle_connection_that_stays_open_is_reused() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        pool = ConnPool(keep_alive=True, bound=1)
        cli, peer = _pair()
        conn = Conn(pool.new_id(), cli, socket.AF_INET, key="k")
        conn.watch(loop, lambda: None)
        conn.unwatch()
        pool.give(conn)
        await asyncio.sleep(0.05)
        assert pool.take("k") is conn and not conn.dead
        conn.close()
        peer.close()

    eventloop.run(go())


def test_a_reserved_connection_closed_before_its_send_is_replaced() -> None:
    """The request reserves its kept-alive connection ahead of its send; the server closes
    that connection meanwhile: the request opens a new one and is measured, with no retry."""
    from app.client.clocks import ClockMap
    from app.client.http_request import parse_target, request_headers
    from app.client.http_stream import StreamRequest
    from app.client.sockets import resolve

    cfg = SimConfig(ttft_ms=1, itl_ms=1, seed=5, idle_timeout_s=0.05)
    with start_simulator_process(cfg) as sim:
        target = parse_target(sim.base_url)

        async def go() -> tuple[Any, Any, ConnPool]:
            family, addr = await resolve(target)
            pool = ConnPool(keep_alive=True, bound=1)
            clock = ClockMap()
            body = (
                b'{"model":"m","prompt":"hello there","max_tokens":2,"stream":true,'
                b'"ignore_eos":true}'
            )

            def req(rid: str) -> StreamRequest:
                return StreamRequest(
                    target, addr, family, "/v1/completions", body,
                    request_headers(target, rid, None),
                    request_id=rid, timeout_s=5.0, clock=clock, pool=pool,
                )  # fmt: skip

            first = await req("a").run()
            second = req("b")
            second.reserve()
            conn = second._reserved
            assert conn is not None
            for _ in range(100):  # the server closes it after 50 ms idle
                await asyncio.sleep(0.01)
                if conn.dead:
                    break
            assert conn.dead
            return first, await second.run(), pool

        first, second, pool = eventloop.run(go())
    assert first.status is RequestStatus.OK and second.status is RequestStatus.OK
    assert second.conn_reused is False and second.retries == 0
    assert pool.stats.closed_idle == 1 and pool.stats.opened == 2


@pytest.mark.skipif(not connpool.tx_stamps_supported(), reason="kernel transmit stamps need Linux")
def test_transmit_stamps_read_stops_at_the_last_byte() -> None:
    """``read_tx_stamps(until=k)`` returns once the stamp keyed at k is read: no further
    read to find the queue empty (the next one finds what is left)."""
    cli, peer = _pair()
    try:
        assert connpool.enable_tx_stamps(cli)
        cli.send(b"a" * 10)
        cli.send(b"b" * 10)
        stamps: list[tuple[int, int]] = []
        for _ in range(100):
            connpool.read_tx_stamps(cli, stamps, until=9)
            if stamps:
                break
        assert [k for k, _ in stamps] == [9]
        for _ in range(100):
            connpool.read_tx_stamps(cli, stamps)
            if len(stamps) == 2:
                break
        assert [k for k, _ in stamps] == [9, 19]
    finally:
        cli.close()
        peer.close()
