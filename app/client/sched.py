"""The load thread's CPU scheduling: optional real-time priority, and how long it waited for a CPU.

With user-space receive stamps an event is stamped when the client gets round to it; while the
client thread is runnable but another task holds its CPU (a kernel thread, a database, the
target itself), every event arriving meanwhile is stamped late by up to that wait. On a 2-core
VM such waits of 2-4 ms were the whole tail of the user-space stamp error.

* ``realtime_priority()`` moves the calling thread to ``SCHED_FIFO`` (priority 1, reset on
  fork so children and new threads do not inherit it) for the duration of a run and restores
  the previous policy afterwards. Any CFS task, kernel threads included, then waits for the
  load thread instead of the other way round; the kernel's real-time throttle
  (``sched_rt_runtime_us``, 95% by default) still leaves the rest of the system a share of a
  saturated CPU. It needs root or ``CAP_SYS_NICE`` (containers: ``--cap-add SYS_NICE``);
  refused, it raises ``RealtimeRefused`` with the reason, before the run starts.
* ``CpuWait`` reads the thread's ``run_delay`` from ``/proc/thread-self/schedstat`` (the time
  it spent runnable but waiting for a CPU): the runner's monitor samples it every tick, so a
  run reports how much of its event-loop lag was the CPU being taken away from it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

REALTIME_PRIORITY = 1
_SCHEDSTAT = "/proc/thread-self/schedstat"


class RealtimeRefused(RuntimeError):
    """The OS refused real-time scheduling for the load thread."""


def realtime_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "SCHED_FIFO")


@dataclass(frozen=True, slots=True)
class Scheduling:
    """How the load thread was scheduled (stored with the run)."""

    policy: str  # "realtime" (SCHED_FIFO) or "normal"
    priority: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"policy": self.policy, "priority": self.priority}


NORMAL = Scheduling("normal")


@contextlib.contextmanager
def realtime_priority(enabled: bool = True) -> Iterator[Scheduling]:
    """Run the body with the calling thread at ``SCHED_FIFO`` priority 1 (when ``enabled``).

    Raises ``RealtimeRefused`` (before the body runs) when the platform lacks it or the
    process may not use it. The previous policy is restored on exit.
    """
    if not enabled:
        yield NORMAL
        return
    if not realtime_supported():
        raise RealtimeRefused(f"real-time scheduling is not available on {sys.platform}")
    old_policy = os.sched_getscheduler(0)
    old_param = os.sched_getparam(0)
    policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(REALTIME_PRIORITY))
    except OSError as e:
        raise RealtimeRefused(
            "the OS refused SCHED_FIFO for the load thread (it needs root or CAP_SYS_NICE; "
            f"in a container add the SYS_NICE capability): {e.strerror or e}"
        ) from None
    try:
        yield Scheduling("realtime", REALTIME_PRIORITY)
    finally:
        with contextlib.suppress(OSError):  # dropping priority is always allowed
            os.sched_setscheduler(0, old_policy & ~getattr(os, "SCHED_RESET_ON_FORK", 0), old_param)


def check_realtime() -> None:
    """Raise ``RealtimeRefused`` now if ``realtime_priority()`` would be refused."""
    with realtime_priority(True):
        pass


class CpuWait:
    """Cumulative time the *opening* thread spent runnable but without a CPU, in ns.

    ``read()`` returns None where the kernel does not expose it (non-Linux, no schedstats).
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            self._fd = fd
            if self.read() is None:
                self.close()

    @property
    def available(self) -> bool:
        return self._fd is not None

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1])
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
