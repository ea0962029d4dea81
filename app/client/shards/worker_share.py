"""One shard of a run dealt over workers (``RunSpec.shards``, docs/scale.md).

Every shard's worker builds the run's whole plan from the seed and deals it over the K
shards exactly as ``plan.py`` deals load processes (request ``i`` keeps its global index,
its prompt and its send time), then runs only its own share, in one load process, from the
common instant its ``StartGate`` gives (the server's start mapped onto this host's
monotonic clock: ``app.worker.shard_gate``). The union of the shares is the unsplit
schedule. ``shard_row`` is the shard's own figures for the run page's "By shard" table."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.client.load_result import LoadResult, Progress
from app.client.runner import run_built
from app.client.shards.merge import ProcessOutcome, process_row
from app.client.shards.plan import build_plan, process_spec
from app.client.shards.share import ShareRun, StartGate
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
    wake_ns: dict[str, int] = field(default_factory=dict)  # phase -> return - start instant
    cpu_ready_s: float = 0.0
    cpu_end_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run_shard(
    spec: RunSpec,
    figures: ShardFigures,
    gate: StartGate,
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
        share=ShareRun(share.warmup_index, share.index, share.session_ids, gate, 0),
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
    return {"shard": figures.shard, **row}
