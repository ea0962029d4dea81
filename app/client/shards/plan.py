"""One schedule, dealt: the run's plan (prompts, send times, sessions) is computed once, from
the seed, in the parent, then dealt to the load processes.

* The measured requests' send times are the unsplit run's (``schedule_for``: the load
  shape, or a trace's own timestamps); request ``i`` keeps its global index, its prompt and
  its time, whichever process sends it, so the union of the shares is exactly the unsplit
  schedule.
* A concurrency ``C`` is ``C`` slots dealt over the processes (slot ``j`` to process
  ``j mod N``); request ``i`` goes with slot ``i mod C``: each process gets requests in
  proportion to its slots. Without a cap, request ``i`` goes to process ``i mod N``.
* A multi-turn session stays on one process for its life (dealt as a request is).
* Warm-ups are dealt ``i mod N``.

Never more processes than slots, or than measured requests (sessions): the rest would idle.
Pure apart from building the workload (``build_plan``); ``deal`` is the rule."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.client.datasets.base import AnyTokenizer, Prompt, Workload
from app.client.datasets.conversations import Conversation, Sessions
from app.client.sessions import build_session_workload, warmup_workload
from app.client.shapes import schedule_for
from app.client.spec import RunSpec
from app.client.workload import build_workload

I64 = npt.NDArray[np.int64]


def spare_cores() -> int:
    """``auto``: the cores this process may run on, less one for everything else (>= 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n - 1)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_processes(processes: int | str) -> int:
    """``RunSpec.processes`` as a count (``auto``: ``spare_cores``)."""
    return spare_cores() if processes == "auto" else int(processes)


def deal(n: int, processes: int, slots: int | None) -> I64:
    """The process of each of ``n`` items (the module doc's rule)."""
    i = np.arange(n, dtype=np.int64)
    if slots is None:
        return i % processes
    return (i % slots) % processes


def slot_shares(slots: int, processes: int) -> list[int]:
    """``slots`` dealt one by one: process ``p`` gets every ``p``-th."""
    return [slots // processes + (1 if p < slots % processes else 0) for p in range(processes)]


@dataclass(frozen=True, slots=True)
class Share:
    """One process's part of the plan."""

    process: int
    slots: int | None  # its concurrency (None: no cap)
    warmup_index: list[int]
    warmup: list[Prompt]
    index: list[int]  # global indices of its measured requests (single requests)
    measured: list[Prompt]
    at_ns: list[int]  # their send times (sessions: each session's arrival), from the phase start
    session_ids: list[int] | None = None  # multi-turn: the global numbers of its sessions
    conversations: list[Conversation] | None = None
    warmup_conversations: list[Conversation] | None = None

    @property
    def planned(self) -> int:
        """Measured requests it will send (sessions: their turns)."""
        if self.conversations is not None:
            return sum(len(c.turns) for c in self.conversations)
        return len(self.measured)

    def workload(self, source: str | None) -> Workload:
        return Workload(self.warmup, self.measured, source, at_ns=self.at_ns)

    def sessions(self, source: str | None) -> Sessions | None:
        if self.conversations is None:
            return None
        return Sessions(self.warmup_conversations or [], self.conversations, source)


@dataclass(frozen=True, slots=True)
class Plan:
    spec: RunSpec  # num_prompts resolved (a trace's line count)
    asked: int  # processes asked for
    shares: list[Share]
    planned: int  # measured requests planned (sessions: their turns)
    warmups: int
    source: str | None
    stats: dict[str, object] | None
    notes: list[str]

    @property
    def processes(self) -> int:
        return len(self.shares)


def deal_plan(
    spec: RunSpec,
    processes: int,
    workload: Workload,
    sessions: Sessions | None,
) -> Plan:
    """Deal a built workload (``build_plan``) to ``processes`` processes."""
    if spec.num_prompts is None:
        spec = spec.model_copy(update={"num_prompts": len(workload.measured)})
    schedule = schedule_for(spec, workload.at_ns)
    times = schedule.times_ns
    units = len(sessions.measured) if sessions is not None else len(workload.measured)
    cap = spec.max_concurrency
    notes: list[str] = []
    n = max(1, min(processes, cap or processes, max(units, 1)))
    if n < processes:
        why = f"concurrency {cap}" if cap is not None and cap < processes else f"{units} requests"
        notes.append(f"{processes} processes asked; {n} used (no more than {why})")
    slots = slot_shares(cap, n) if cap is not None else None
    owners = deal(units, n, cap)
    warm_owners = deal(len(workload.warmup), n, None)
    shares: list[Share] = []
    for p in range(n):
        mine = np.flatnonzero(owners == p).tolist()
        wmine = np.flatnonzero(warm_owners == p).tolist()
        at = [int(times[i]) for i in mine]
        if sessions is not None:
            shares.append(
                Share(
                    process=p,
                    slots=None if slots is None else slots[p],
                    warmup_index=wmine,
                    warmup=[workload.warmup[i] for i in wmine],
                    index=[],
                    measured=[],
                    at_ns=at,
                    session_ids=mine,
                    conversations=[sessions.measured[i] for i in mine],
                    warmup_conversations=[sessions.warmup[i] for i in wmine],
                )
            )
        else:
            w = len(workload.warmup)
            shares.append(
                Share(
                    process=p,
                    slots=None if slots is None else slots[p],
                    warmup_index=wmine,
                    warmup=[workload.warmup[i] for i in wmine],
                    index=[w + i for i in mine],
                    measured=[workload.measured[i] for i in mine],
                    at_ns=at,
                )
            )
    planned = sum(s.planned for s in shares)
    return Plan(
        spec, processes, shares, planned, len(workload.warmup), workload.source,
        workload.stats, notes,
    )  # fmt: skip


def build_plan(
    spec: RunSpec,
    processes: int,
    tok: AnyTokenizer,
    *,
    dataset_dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Plan:
    """The run's whole workload, built once from the seed as the one-process runner builds
    it (``app.client.runner.run_load``), dealt to ``processes`` processes."""
    sessions: Sessions | None = None
    if spec.multi_turn:
        sessions = build_session_workload(spec, tok, dataset_dirs, cancelled)
        workload = warmup_workload(sessions, tok)
    else:
        workload = build_workload(spec, tok, dataset_dirs=dataset_dirs, cancelled=cancelled)
    return deal_plan(spec, processes, workload, sessions)


def process_spec(spec: RunSpec, share: Share) -> RunSpec:
    """The spec one process runs: its slots, its counts, one process."""
    n = len(share.conversations) if share.conversations is not None else len(share.measured)
    return spec.model_copy(
        update={
            "max_concurrency": share.slots,
            "num_prompts": max(n, 1),
            "warmup_requests": len(share.warmup),
            "processes": 1,
        }
    )
