"""The one scheduler task of the simulator: a single heap of next-emit deadlines for every
active request (no task, no sleep per stream per token). ``Scheduler`` sleeps until just
before the earliest deadline, polls the loop until it is due, then steps every entry that is
due (``Steppable.step`` writes and returns the next deadline, or None to leave the heap);
``resolve`` completes a future once (the scheduler's wake-up, a handle's stop).
"""

from __future__ import annotations

import asyncio
import heapq
from time import monotonic_ns
from typing import Protocol

_SLOT_BITS = 20  # at most ~1M concurrent requests
_SLOT_MASK = (1 << _SLOT_BITS) - 1


class Steppable(Protocol):
    """A request in the heap (``generator.Gen``)."""

    def step(self, due: int, now: int) -> int | None: ...


class Scheduler:
    """One task, one heap of deadlines for every active request.

    Heap entries are plain ints ``(deadline_ns << _SLOT_BITS) | slot`` (cheap to compare, not
    tracked by the garbage collector); ``slot`` indexes the generator. epoll sleeps in whole
    milliseconds (rounded up), so the task sleeps until ``spin_ns`` before the next deadline
    and then polls the loop (``sleep(0)``: I/O is still served) until it is due. Deadlines
    are absolute: lateness never accumulates.
    """

    def __init__(self, spin_ns: int) -> None:
        self._heap: list[int] = []
        self._slots: list[Steppable | None] = []
        self._free: list[int] = []
        self._spin_ns = spin_ns
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_due = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: int, gen: Steppable) -> None:
        if self._free:
            slot = self._free.pop()
            self._slots[slot] = gen
        else:
            slot = len(self._slots)
            if slot > _SLOT_MASK:
                raise RuntimeError("too many concurrent requests for the simulator")
            self._slots.append(gen)
        heapq.heappush(self._heap, (due << _SLOT_BITS) | slot)
        w = self._waiter
        if w is not None and due < self._waiter_due and not w.done():
            w.set_result(None)

    def clear(self) -> None:
        self._heap.clear()
        self._slots.clear()
        self._free.clear()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        heap = self._heap
        while True:
            if not heap:
                await self._sleep(loop, None)
                continue
            now = monotonic_ns()
            due = heap[0] >> _SLOT_BITS
            if due <= now:
                self._run_due(now)
                await asyncio.sleep(0)
            elif due - now <= self._spin_ns:
                await asyncio.sleep(0)
            else:
                await self._sleep(loop, due)

    def _run_due(self, now: int) -> None:
        heap, slots = self._heap, self._slots
        limit = (now + 1) << _SLOT_BITS
        while heap and heap[0] < limit:
            key = heap[0]
            slot = key & _SLOT_MASK
            gen = slots[slot]
            assert gen is not None
            nxt = gen.step(key >> _SLOT_BITS, now)
            if nxt is None:
                heapq.heappop(heap)
                slots[slot] = None
                self._free.append(slot)
            else:
                heapq.heapreplace(heap, (nxt << _SLOT_BITS) | slot)

    async def _sleep(self, loop: asyncio.AbstractEventLoop, due: int | None) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        self._waiter = fut
        self._waiter_due = due if due is not None else 2**63
        handle = None
        if due is not None:
            handle = loop.call_at((due - self._spin_ns) / 1e9, resolve, fut)
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None


def resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
