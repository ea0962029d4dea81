"""One shard of a run dealt over workers (``RunSpec.shards``, docs/scale.md).

Every shard's worker builds the run's whole plan from the seed and deals it over the K
shards exactly as ``plan.py`` deals load processes (request ``i`` keeps its global index,
its prompt and its send time), then runs only its own share from the common instant its
gate gives (the server's start mapped onto this host's monotonic clock:
``app.worker.shard_gate``): in one load process, or (the worker's ``--processes N``) dealt
again over N load processes of this host (``local_plan``), every one of which starts at
that instant. With warm-ups, every shard's measured phase starts at a second common
instant, after every shard's warm-ups. The union of the shares is the unsplit schedule.
``shard_row`` is the shard's own figures for the run page's "By shard" table."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from app.client.load_result import LoadResult, Progress
from app.client.runner import run_built
from app.client.shards.coordinator import run_plan
from app.client.shards.merge import ProcessOutcome, process_row
from app.client.shards.plan import (
    Plan,
    Share,
    build_plan,
    deal_plan,
    process_spec,
    resolve_processes,
)
from app.client.shards.share import InstantGate, ShareRun, StartGate
from app.client.spec import RunSpec
from app.client.target_keys import resolve_api_key
from app.client.tokenizer import load_tokenizer
from app.domain import RequestRecord


@dataclass(slots=True)
class ShardFigures:
    """What a shard measured of itself beyond its records (filled by its gate and run)."""

    shard: int
    shards: int
    planned: int = 0
    processes: int = 1  # this host's load processes that ran the share
    wake_ns: dict[str, int] = field(default_factory=dict)  # phase -> return - start instant
    cpu_ready_s: float = 0.0
    cpu_end_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class ShardGateLike(StartGate, InstantGate, Protocol):
    """A shard's gate: waits for an instant (one process) or only answers it (several)."""


def local_plan(plan: Plan, share: Share, processes: int) -> Plan:
    """A shard's share dealt over this host's ``processes`` load processes by ``plan.py``'s
    rule (its slots over them, request ``i`` of the share with slot ``i mod C``), every
    request keeping its global index, prompt and send time: the union over the shards and
    their processes is the unsplit schedule. Its ``warmups`` are the whole run's (every
    process's measured phase is gated)."""
    one = process_spec(plan.spec, share)
    sub = deal_plan(one, processes, share.workload(plan.source), None)
    w = len(share.warmup)
    shares = [
        replace(
            s,
            warmup_index=[share.warmup_index[i] for i in s.warmup_index],
            index=[share.index[i - w] for i in s.index],
        )
        for s in sub.shares
    ]
    return replace(sub, shares=shares, warmups=plan.warmups, source=plan.source)


async def run_shard(
    spec: RunSpec,
    figures: ShardFigures,
    gate: ShardGateLike,
    *,
    run_tag: str,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
    kernel_stamps: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    realtime: bool = False,
    dataset_dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
    allow_link_local: bool = True,
) -> LoadResult:
    """Shard ``figures.shard`` of ``spec.shards``: its share of the plan, started by ``gate``."""
    spec = resolve_api_key(spec)
    tok = load_tokenizer(spec.tokenizer, dataset_dirs)
    plan = build_plan(spec, figures.shards, tok, dataset_dirs=dataset_dirs, cancelled=cancelled)
    if figures.shard >= plan.processes:
        why = "; ".join(plan.notes).replace("processes", "shards")
        raise ValueError(f"shards: shard {figures.shard} has no share of the run ({why})")
    share = plan.shares[figures.shard]
    figures.planned = share.planned
    mine = figures.records

    def keep(rec: RequestRecord) -> None:
        mine.append(rec)
        if on_record is not None:
            on_record(rec)

    n = resolve_processes(spec.processes)
    if n > 1 and share.conversations is None:  # the worker's --processes: dealt again here
        sub = local_plan(plan, share, n)
        figures.processes = sub.processes
        figures.cpu_ready_s = cpu_s()
        result = await run_plan(
            sub,
            tok.name,
            run_tag=run_tag,
            on_progress=on_progress,
            stop=stop,
            kernel_stamps=kernel_stamps,
            on_record=keep,
            realtime=realtime,
            dataset_dirs=dataset_dirs,
            allow_link_local=allow_link_local,
            gate=gate,
        )
        # its CPU is its processes' (summed); it woke as late as its latest process
        used = 0.0
        for row in result.processes:
            c = row.get("cpu_s")
            used += float(c) if isinstance(c, int | float) else 0.0
            for phase, us in (row.get("wake_us") or {}).items():  # type: ignore[attr-defined]
                ns = int(us * 1e3)
                figures.wake_ns[phase] = max(figures.wake_ns.get(phase, ns), ns)
        figures.cpu_end_s = figures.cpu_ready_s + used
        result.notes.extend(n.replace("processes", "shards") for n in plan.notes)
        return result
    one = process_spec(plan.spec, share).model_copy(update={"shards": 1})
    figures.cpu_ready_s = cpu_s()
    result = await run_built(
        one,
        run_tag,
        tok,
        share.workload(plan.source),
        share.sessions(plan.source),
        on_progress=on_progress,
        stop=stop,
        kernel_stamps=kernel_stamps,
        on_record=keep,
        realtime=realtime,
        allow_link_local=allow_link_local,
        share=ShareRun(share.warmup_index, share.index, share.session_ids, gate, plan.warmups),
    )
    figures.cpu_end_s = cpu_s()
    result.notes.extend(n.replace("processes", "shards") for n in plan.notes)
    return result


def shard_row(figures: ShardFigures, result: LoadResult | None) -> dict[str, object]:
    """The shard's row of the run page's "By shard" table (``process_row``'s figures, named
    by shard; the clock offset and bound are added by the worker)."""
    o = ProcessOutcome(figures.shard, figures.planned, figures.records, result, figures.wake_ns)
    o.cpu_run_s = max(0.0, figures.cpu_end_s - figures.cpu_ready_s)
    row = process_row(o, result.measure_start_ns if result is not None else 0)
    row.pop("process", None)
    row.pop("pid", None)
    # the start instant on this host's monotonic clock (hosts apart, comparable only on one)
    row["start_mono_ns"] = result.start_mono_ns if result is not None else None
    row["processes"] = figures.processes
    # with warm-ups: the measured phase's start, and its last warm-up's end, on the run's
    # axis (from the common start): every shard's start is after every shard's warm-ups
    warm = [r.end_ns for r in figures.records if r.warmup and r.end_ns is not None]
    row["warmup_end_ms"] = max(warm) / 1e6 if warm else None
    row["measure_start_ms"] = result.measure_start_ns / 1e6 if result is not None else None
    return {"shard": figures.shard, **row}
