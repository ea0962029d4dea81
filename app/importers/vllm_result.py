"""Parse ``vllm bench serve --save-result [--save-detailed]`` JSON. Pure: no I/O.

One object per run; ``--append-result`` files hold several objects one after another, and
each becomes a run. With ``--save-detailed`` the per-request arrays (``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``errors``, and ``start_times`` where the vLLM version
writes them) give each request's chunk times: the first at ``start + ttft``, the next ones
``itls`` apart (vLLM's own reconstruction). Without them the run is summary-only: it has no
requests, only the file's headline figures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sized
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.analysis.percentiles import percentile_key
from app.domain import F64, I64, RequestRecord
from app.importers.common import (
    MAX_ABS_S,
    MAX_COUNT,
    FileFigures,
    ImportedRun,
    ImportFormatError,
    as_dict,
    as_list,
    chunk_record,
    failed_record,
    integer,
    json_objects,
    ns,
    number,
    numbered_name,
    opt_number,
)

METRICS = ("ttft", "tpot", "itl", "e2el")
THROUGHPUTS = {
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "total_token_throughput": "total_token_throughput",
    "request_goodput": "request_goodput",
}
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
META_KEYS = (
    "date",
    "backend",
    "endpoint_type",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "burstiness",
    "max_concurrency",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
BATCH = 1000  # requests per batch of records
INT64_MAX = 2**63 - 1
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def _stat_key(p: float) -> str:
    return percentile_key(p)


def file_figures(obj: dict[str, Any], where: str) -> FileFigures:
    """The object's headline figures, keyed like the vLLM definition profile."""
    figs: FileFigures = {}
    for m in METRICS:
        stats: dict[str, float | None] = {}
        for stat, key in (("mean", f"mean_{m}_ms"), ("std", f"std_{m}_ms")):
            if key in obj:
                stats[stat] = opt_number(obj[key], f"{where}.{key}")
        if f"median_{m}_ms" in obj:
            stats["p50"] = opt_number(obj[f"median_{m}_ms"], f"{where}.median_{m}_ms")
        if stats:
            figs[m] = stats
    for key, value in obj.items():
        match = _PCT.match(key)
        if match:
            p = float(match.group(1))
            if not 0 <= p <= 100:
                raise ImportFormatError(f"{where}.{key}: percentile out of range")
            figs.setdefault(match.group(2), {})[_stat_key(p)] = opt_number(value, f"{where}.{key}")
    for key, metric in THROUGHPUTS.items():
        if key in obj:
            figs[metric] = {"value": opt_number(obj[key], f"{where}.{key}")}
    return figs


def _request_rate(obj: dict[str, Any], where: str) -> float | None:
    rate = obj.get("request_rate")
    if rate is None:
        return None
    if rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
        return math.inf
    if isinstance(rate, str):
        try:
            return float(rate)
        except ValueError:
            raise ImportFormatError(f"{where}.request_rate: not a number: {rate!r}") from None
    return number(rate, f"{where}.request_rate", minimum=0)


class _ListGaps:
    """``itls`` as ``json`` built it: a list with one entry per request."""

    def __init__(self, itls: list[Any]) -> None:
        self._itls = itls

    def __len__(self) -> int:
        return len(self._itls)

    def check(self, i: int, at: str) -> None:
        as_list(self._itls[i], f"{at}: itls")

    def ns(self, i: int, at: str) -> I64:
        gaps = self._itls[i]
        return np.array(
            [ns(number(gap, f"{at}: itls[{j}]", minimum=0)) for j, gap in enumerate(gaps)],
            np.int64,
        )


@dataclass(frozen=True)
class FlatGaps:
    """``itls`` read by the streamed reader: every request's gaps (s) in one float array,
    request i's at ``values[offsets[i]:offsets[i + 1]]``; every entry was a list of numbers
    (ints >= 0 or floats): anything else is left to the ``json`` reader."""

    values: F64
    offsets: I64

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def check(self, i: int, at: str) -> None:
        return None

    def ns(self, i: int, at: str) -> I64:
        gaps = self.values[self.offsets[i] : self.offsets[i + 1]]
        bad = np.flatnonzero((gaps < 0) | ~(np.abs(gaps) < MAX_ABS_S))
        if bad.size:  # the first bad gap, with the message the list path gives for it
            j = int(bad[0])
            ns(number(float(gaps[j]), f"{at}: itls[{j}]", minimum=0))
        out: I64 = np.rint(gaps * 1e9).astype(np.int64)  # ns(): round half to even
        return out


def _chunk_times(first_ns: int, gaps_ns: I64, at: str) -> I64:
    """The first chunk at ``first_ns``, the next ones ``gaps_ns`` apart (all >= 0)."""
    if first_ns > INT64_MAX:
        raise ImportFormatError(f"{at}: ttfts: the first chunk time is out of range")
    t = np.empty(gaps_ns.shape[0] + 1, np.int64)
    t[0] = first_ns
    t[1:] = gaps_ns
    np.cumsum(t, out=t)
    if t.size and int(t.min()) < 0:  # int64 wrapped: the sum of the gaps is out of range
        raise ImportFormatError(f"{at}: itls: the chunk times are out of range")
    return t


def _record_batches(
    obj: dict[str, Any], where: str, notes: list[str], batch: int
) -> Iterator[list[RequestRecord]]:
    """The requests ``batch`` at a time, checked in file order; the notes they call for are
    appended to ``notes`` (the last one once every batch was read)."""
    arrays = {k: as_list(obj[k], f"{where}.{k}") for k in DETAIL_KEYS[:3]}
    itls = obj["itls"]
    gaps = itls if isinstance(itls, FlatGaps) else _ListGaps(as_list(itls, f"{where}.itls"))
    n = len(arrays["ttfts"])
    errors = as_list(obj.get("errors", [""] * n), f"{where}.errors")
    starts_raw = obj.get("start_times")
    starts = as_list(starts_raw, f"{where}.start_times") if starts_raw is not None else None
    lengths: list[tuple[str, Sized | None]] = [
        *arrays.items(),
        ("itls", gaps),
        ("errors", errors),
        ("start_times", starts),
    ]
    for key, arr in lengths:
        if arr is not None and len(arr) != n:
            raise ImportFormatError(
                f"{where}.{key}: has {len(arr)} entries but ttfts has {n} (one per request)"
            )
    if starts is None:
        notes.append(
            "the file has no start_times: every request is placed at t = 0, so the timeline "
            "and our throughputs are not meaningful; per-request latencies are exact"
        )
        start_s = [0.0] * n
    else:
        start_s = [number(v, f"{where}.start_times[{i}]") for i, v in enumerate(starts)]
    origin = min(start_s) if start_s else 0.0
    multi = 0
    records: list[RequestRecord] = []
    for i in range(n):
        at = f"{where} request {i}"
        sent = ns(start_s[i] - origin)
        n_in = integer(arrays["input_lens"][i], f"{at}: input_lens", minimum=0, maximum=MAX_COUNT)
        err = errors[i]
        if err is not None and not isinstance(err, str):
            raise ImportFormatError(f"{at}: errors must be strings, got {err!r}")
        ttft = number(arrays["ttfts"][i], f"{at}: ttfts", minimum=0)
        gaps.check(i, at)
        if err or ttft <= 0:
            records.append(
                failed_record(
                    i,
                    sent_ns=sent,
                    end_ns=None,
                    error=err or "failed (no first token)",
                    input_tokens=n_in,
                )
            )
        else:
            n_out = integer(
                arrays["output_lens"][i], f"{at}: output_lens", minimum=0, maximum=MAX_COUNT
            )
            chunk_t = _chunk_times(sent + ns(ttft), gaps.ns(i, at), at)
            if n_out > chunk_t.shape[0]:
                multi += 1
            records.append(
                chunk_record(
                    i,
                    sent_ns=sent,
                    chunk_t_ns=chunk_t,
                    output_tokens=n_out,
                    input_tokens=n_in,
                )
            )
        if len(records) >= batch:
            yield records
            records = []
    if records:
        yield records
    if multi:
        notes.append(
            f"{multi} requests have more output tokens than chunks: vLLM records chunk "
            "gaps, so per-token ITL here is per chunk for them"
        )


def _then_raise(
    batches: Iterator[list[RequestRecord]], error: ImportFormatError | None
) -> Iterator[list[RequestRecord]]:
    yield from batches
    if error is not None:
        raise error


def read_object(
    obj: Any, k: int, several: bool, base_name: str, *, batch: int = BATCH
) -> tuple[ImportedRun, Iterator[list[RequestRecord]]]:
    """Object ``k`` of a file (``several``: the file holds more than one) as a run without
    its records, and its records ``batch`` at a time. The object's own fields are checked
    here; the requests (then ``request_rate``) as the batches are read: the run is sound
    only once they all were. ``run.notes`` is complete then too."""
    where = f"object {k + 1}" if several else "result"
    d = as_dict(obj, where)
    for key in ("duration", "completed"):
        if key not in d:
            raise ImportFormatError(
                f"{where}: missing {key!r}: not a vllm bench serve --save-result file"
            )
    duration = number(d["duration"], f"{where}.duration", minimum=0)
    integer(d["completed"], f"{where}.completed", minimum=0)
    figures = file_figures(d, where)
    notes: list[str] = []
    detailed = all(key in d for key in DETAIL_KEYS)
    if detailed:
        batches = _record_batches(d, where, notes, batch)
        summary_only = False
    else:
        missing = [key for key in DETAIL_KEYS if key not in d]
        if len(missing) != len(DETAIL_KEYS):
            raise ImportFormatError(f"{where}: per-request arrays incomplete: missing {missing}")
        batches = iter(())
        summary_only = True
        notes.append("saved without --save-detailed: no per-request data, only the file's figures")
    rate_error: ImportFormatError | None = None
    try:  # checked after the requests, as it always was: its error waits for them
        rate = _request_rate(d, where)
    except ImportFormatError as e:
        rate, rate_error = None, e
    label = d.get("label") or d.get("backend") or "vllm"
    parts = [str(label)]
    if rate is not None:
        parts.append(f"rate {'inf' if math.isinf(rate) else f'{rate:g}'}")
    if d.get("max_concurrency") is not None:
        parts.append(f"concurrency {d['max_concurrency']}")
    name = numbered_name(base_name, f" #{k + 1} ({', '.join(parts)})") if several else base_name
    meta: dict[str, Any] = {key: d.get(key) for key in META_KEYS if key in d}
    meta["request_rate"] = None if rate is None else ("inf" if math.isinf(rate) else rate)
    meta["duration_s"] = duration
    meta["object_index"] = k
    run = ImportedRun(
        name=name,
        format="vllm",
        tool="vLLM bench serve",
        profile="vllm",
        records=[],
        summary_only=summary_only,
        figures=figures,
        model=str(d["model_id"]) if d.get("model_id") else None,
        window_s=duration,
        notes=notes,
        meta=meta,
    )
    return run, _then_raise(batches, rate_error)


def parse_vllm_result(text: str, *, name: str = "vllm") -> list[ImportedRun]:
    """Every result object in the file, in order; ``ImportFormatError`` on the first bad one."""
    objs = json_objects(text)
    runs = []
    for k, o in enumerate(objs):
        run, batches = read_object(o, k, len(objs) > 1, name)
        records = [r for b in batches for r in b]
        runs.append(replace(run, records=records))
    return runs
