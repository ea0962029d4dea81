"""Work that can wait lets the loop read first: the run's post-processing ends its slice as
soon as a socket is ready (``StampingSelector.io_ready``), so a reply's end waiting in a
socket is read after one piece, not after a whole slice of pieces."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

from app.client import eventloop
from app.client.http_request import parse_target
from app.client.load_run import HOLD_BACKLOG_MAX, POSTPROCESS_SLICE_NS, LoadRun
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer

PIECE_NS = POSTPROCESS_SLICE_NS // 3  # three pieces fit in a slice


def test_io_ready_peeks_without_taking_the_event() -> None:
    async def main() -> list[bool]:
        sel = eventloop.stamping_selector(asyncio.get_running_loop())
        assert sel is not None
        a, b = socket.socketpair()
        a.setblocking(False)
        got: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def readable() -> None:
            if not got.done():
                got.set_result(None)

        asyncio.get_running_loop().add_reader(a.fileno(), readable)
        seen = [sel.io_ready()]
        b.send(b"x")
        seen += [sel.io_ready(), sel.io_ready()]
        await got  # the loop's own poll still saw it
        asyncio.get_running_loop().remove_reader(a.fileno())
        a.close()
        b.close()
        return seen

    assert eventloop.run(main()) == [False, True, True]


def _run(backlog: int) -> int:
    """Post-processing pieces run before the loop read a socket that was ready when they
    began, with ``backlog`` streams waiting."""

    async def main() -> int:
        spec = RunSpec(base_url="http://127.0.0.1:9", model="m", scrape_metrics=False)
        r = LoadRun(spec, "rf", BuiltinTokenizer(), parse_target(spec.base_url), None, None, False)
        pieces = 0

        def steps(*_: Any) -> Iterator[None]:
            nonlocal pieces
            for _k in range(50):
                t_end = time.monotonic_ns() + PIECE_NS
                while time.monotonic_ns() < t_end:  # a piece's work
                    pass
                pieces += 1
                yield

        r.finish_steps = steps  # type: ignore[method-assign,assignment]
        a, b = socket.socketpair()
        a.setblocking(False)
        loop = asyncio.get_running_loop()
        read_after: asyncio.Future[int] = loop.create_future()

        def readable() -> None:
            if not read_after.done():
                read_after.set_result(pieces)

        loop.add_reader(a.fileno(), readable)
        b.send(b"end of a reply")
        r.backlog.extend([(None, None, None)] * backlog)  # type: ignore[list-item]
        post = asyncio.create_task(r.postprocess())
        r.backlog_ready.set()
        n = await read_after
        post.cancel()
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        return n

    return eventloop.run(main())


def test_a_ready_socket_is_read_after_one_piece_of_post_processing() -> None:
    assert _run(backlog=3) == 1
    # a long backlog is not held back: the slice runs on (memory before latency)
    assert _run(backlog=HOLD_BACKLOG_MAX + 5) >= 2
