"""Dataset type ``timed_jsonl``: a fixed schedule of your own prompts (AIPerf's fixed
schedule). One object per line: ``timestamp`` (ms from the trace's start) and
``{"prompt": ...}`` or ``{"messages": [...]}``, optionally ``"output_len": N`` (as
``jsonl``). Request k is sent at ``(timestamp_k - timestamp_0) / speedup`` after the
measured phase starts; the first ``num_prompts`` lines are replayed (a shorter file is
refused), every line when ``num_prompts`` is not given (``trace_times``). Warm-ups come
from the end of the file among the lines the replay does not send (cycled): a warm-up never
sends a measured prompt first, so a file replayed whole has none to give and warm-ups are
refused naming the counts. A bad timestamp (decreasing, not a finite number of ms, out of
range), or any bad line, is a ``ValueError`` naming the line and field; nothing is sent.
The run records the file's sha256 (``Workload.source``).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.client.datasets.base import (
    BuildContext,
    FileDigest,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
    json_object_line,
    open_dataset,
)
from app.client.datasets.jsonl import parse_prompt_line
from app.client.datasets.trace_times import replayed, schedule_ns, timestamp_of


class TimedJsonlOptions(BaseModel):
    model_config = {"extra": "forbid"}

    speedup: float = Field(
        1.0, gt=0, le=1_000_000, description="divide the file's timestamps by this"
    )


class TimedJsonlDataset:
    name = "timed_jsonl"
    summary = "prompts or chat messages with a 'timestamp' (ms) each: sent on that schedule"
    options: type[BaseModel] = TimedJsonlOptions
    timed = True

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError("dataset_path is required when dataset is 'timed_jsonl'")

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded by the file's size (MAX_DATASET_BYTES)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, TimedJsonlOptions) and params.dataset_path is not None
        items: list[tuple[float, int, Prompt]] = []
        previous: float | None = None
        digest = FileDigest()
        lines = open_dataset(params.dataset_path, ctx.dataset_dirs, digest.update)
        for lineno, line in enumerate(lines, 1):
            check_cancel(ctx.cancelled, lineno)
            if not line.strip():
                continue
            where = f"dataset_path line {lineno}"
            obj = json_object_line(line, lineno, " with 'timestamp'")
            previous = timestamp_of(obj, where, previous)
            prompt = parse_prompt_line(obj, where, ctx.tokenizer, params.output_len)
            items.append((previous, lineno, prompt))
        if not items:
            raise ValueError("dataset_path: no prompts in the file")
        n = replayed(len(items), params.num_prompts, "timed prompts")
        chosen, rest = items[:n], items[n:]
        w = params.warmup_requests
        if w and not rest:
            raise ValueError(
                f"warmup_requests: {w} warm-ups need lines the replay does not send, and it "
                f"sends all {len(items)} of the file's timed prompts (a warm-up would send a "
                "measured prompt first): give num_prompts below that, or no warm-ups"
            )
        warm = [rest[-1 - (i % len(rest))][2] for i in range(w)]
        at = schedule_ns([t for t, _, _ in chosen], [k for _, k, _ in chosen], options.speedup)
        stats: dict[str, object] = {
            "kind": "trace",
            "speedup": options.speedup,
            "trace_span_ms": chosen[-1][0] - chosen[0][0],
        }
        return Workload(warm, [p for _, _, p in chosen], digest.source(), at_ns=at, stats=stats)


TIMED_JSONL = TimedJsonlDataset()
