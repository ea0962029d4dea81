"""What one load process of a dealt run needs besides its spec and prompts: the global
indices of its requests, its sessions' numbers, and its start gate.

``StartGate.start_at(phase)`` returns a monotonic instant shared by every process of the
run ("run": the run's origin, once the process is ready; "measure": the measured phase's
start, after the warm-ups), having waited until it (``app.client.runner`` then counts from
it). Every process of a host reads the same ``CLOCK_MONOTONIC``, so one instant starts them
all together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class StartGate(Protocol):
    async def start_at(self, phase: str) -> int: ...


class InstantGate(Protocol):
    """The instant of ``phase`` without the wait: a shard's (``app.worker.shard_gate``),
    handed to its load processes, each of which waits for it itself."""

    async def instant(self, phase: str) -> int: ...


@dataclass(frozen=True, slots=True)
class ShareRun:
    """A process's part of a run as the runner sees it."""

    warmup_index: list[int]  # the global index of each of its warm-ups
    index: list[int]  # the global index of each of its measured requests (not sessions)
    session_ids: list[int] | None  # the global number of each of its sessions
    gate: StartGate
    warmups: int = 0  # the run's warm-ups (all processes): the measured phase is gated too
