"""Capped exponential backoff with jitter, and a sleep that a stop event cuts short."""

from __future__ import annotations

import asyncio
import contextlib
import random


class Backoff:
    """Delays ``initial * 2**n`` capped at ``maximum``, each scaled by a random factor in
    [0.5, 1] so that many workers retrying a restarted server do not arrive in lockstep."""

    def __init__(self, initial_s: float, maximum_s: float, *, rng: random.Random | None = None):
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        base = min(self.maximum_s, self.initial_s * 2.0 ** min(self.failures, 60))
        self.failures += 1
        return base * (0.5 + 0.5 * self._rng.random())

    def reset(self) -> None:
        self.failures = 0


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    if stop.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    return stop.is_set()
