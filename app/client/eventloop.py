"""The load generator's event loop: a selector that notes when each poll returned, and
tells work that can wait whether a socket is ready (``io_ready``).

With user-space receive stamps, reading ready sockets one after another in one I/O round
would stamp the last of them later than the first, although all their data was already
there when the poll returned. ``StampingSelector`` records that moment (``ready_ns``) and
the read callback uses it as the user-space stamp of every read of the round. Kernel
receive stamps (``SO_TIMESTAMPNS``) do not depend on it.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class StampingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's default selector, plus the monotonic time its last poll returned."""

    ready_ns: int = 0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        events: list[tuple[Any, int]] = super().select(timeout)
        self.ready_ns = time.monotonic_ns()
        return events

    def io_ready(self) -> bool:
        """Whether a registered socket is ready now (a zero-timeout poll; readiness is
        level-triggered, so the loop's next poll still sees it): work that can wait checks
        this between its pieces and lets the loop read first."""
        poll = getattr(self, "_selector", None)  # the epoll object of an EpollSelector
        if hasattr(select, "epoll") and isinstance(poll, select.epoll):
            return bool(poll.poll(0, 1))  # one event is enough: no list of every ready socket
        return bool(super().select(0))


def new_event_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(StampingSelector())


def stamping_selector(loop: asyncio.AbstractEventLoop) -> StampingSelector | None:
    """The loop's ``StampingSelector``, or None for any other loop (stamps at read time)."""
    sel = getattr(loop, "_selector", None)
    return sel if isinstance(sel, StampingSelector) else None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a loop with a ``StampingSelector``.

    The result leaves the main task through a box: on Python 3.11 the runner, restoring the
    SIGINT handler at the end, formats the handler's repr, which holds the main task and so
    the repr of its result (a load's every record and their arrays: seconds of CPU for a
    thousand requests)."""
    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
    return box[0]
