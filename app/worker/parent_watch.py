"""A worker whose life is tied to its parent's: the embedded worker of ``tokentrace serve``
(``tokentrace worker --exit-with-parent PID``).

When the server dies, even by SIGKILL (no shutdown code runs), its worker stops too: on
Linux the kernel sends it SIGTERM (``PR_SET_PDEATHSIG``, asked for at start; the worker's
SIGTERM handler stops it as ``stop()`` would), and on every system ``watch_parent`` sees
the parent gone (the worker was re-parented) within ``WATCH_PERIOD_S``. A running job then
ends within the shutdown grace, its finished requests kept in the spool; if the worker is
still alive ``EXIT_DEADLINE_S`` later, ``hard_exit_after`` ends the process.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_PERIOD_S = 0.5
EXIT_DEADLINE_S = 30.0  # after the parent is gone, on top of the shutdown grace
PARENT_GONE_EXIT = 3  # the exit status of a worker whose parent had gone


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel for SIGTERM when the parent dies (Linux; elsewhere ``watch_parent``
    alone does it). False when ``parent_pid`` is not this process's parent any more (it
    died before the request could take effect)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    return os.getppid() == parent_pid


async def watch_parent(parent_pid: int, gone: asyncio.Event) -> None:
    """Set ``gone`` once ``parent_pid`` is no longer this process's parent."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(WATCH_PERIOD_S)
    log.warning("the parent process %d is gone: stopping", parent_pid)
    gone.set()


def hard_exit_after(seconds: float) -> threading.Timer:
    """End the process (``os._exit``) ``seconds`` from now unless cancelled first."""

    def end() -> None:
        log.error("still running %.0f s after the parent died: exiting", seconds)
        os._exit(PARENT_GONE_EXIT)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return timer
