"""Read a vLLM result file as a stream: one object at a time, its ITLs in one float array.

``json.loads`` of a 80 MB ``--save-detailed`` file builds 10 million Python floats (and
``generated_texts``) before a single request is checked; here the file is read with ijson,
the per-request ``itls`` go straight into a float array (8 bytes a gap), the keys the run
does not use are skipped unbuilt, and ``vllm_result.read_object`` then makes the requests a
batch at a time, with exactly the checks (and messages) of ``parse_vllm_result``.

Anything the streamed reader cannot vouch for raises ``StreamRefused`` (see
``json_stream``): the caller then reads the file with ``parse_vllm_result``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import ijson
import numpy as np

from app.domain import RequestRecord
from app.importers.common import EventBudget, ImportedRun
from app.importers.json_stream import (
    Event,
    StreamRefused,
    build_value,
    json_events,
    refused,
    skip_value,
)
from app.importers.vllm_result import (
    BATCH,
    DETAIL_KEYS,
    META_KEYS,
    METRICS,
    THROUGHPUTS,
    FlatGaps,
    read_object,
)

_PCT_SUFFIXES = tuple(f"_{m}_ms" for m in METRICS)
_KEPT = frozenset(
    (
        "duration",
        "completed",
        "request_rate",
        "errors",
        "start_times",
        *DETAIL_KEYS,
        *META_KEYS,
        *THROUGHPUTS,
        *(f"{stat}_{m}_ms" for stat in ("mean", "std", "median") for m in METRICS),
    )
)


def _kept(key: str) -> bool:
    """The keys ``read_object`` reads (the others are skipped without being built)."""
    return key in _KEPT or (key.startswith("p") and key.endswith(_PCT_SUFFIXES))


@dataclass(frozen=True)
class StreamedRun:
    run: ImportedRun  # records empty: they come in ``batches``
    batches: Iterator[list[RequestRecord]]
    several: bool  # the file holds more than one object


class VllmStream:
    """The runs of a vLLM result file read from ``stream``, in file order.

    Iterate once; read each run's batches before asking for the next run. On an
    ``ImportFormatError`` call ``drain()`` before reporting it: a later part of the file
    that the streamed reader refuses (a syntax error, invalid UTF-8) is what ``json`` would
    have reported first."""

    def __init__(
        self,
        stream: BinaryIO,
        *,
        name: str,
        batch: int = BATCH,
        budget: EventBudget | None = None,
    ) -> None:
        self._events: Iterator[Event] = json_events(stream)
        self._name = name
        self._batch = batch
        self._budget = budget  # ITL gaps read count against it (``ImportTooLarge``)

    def __iter__(self) -> Iterator[StreamedRun]:
        try:
            yield from self._runs()
        except ijson.JSONError as e:
            raise refused(e) from None

    def _runs(self) -> Iterator[StreamedRun]:
        events = self._events
        first = next(events, None)
        if first is None:
            raise StreamRefused("no JSON value")  # json's "the file is empty"
        k = 0
        while first is not None:
            if first[0] != "start_map":
                raise StreamRefused("a top-level value that is not an object")
            obj = _read_map(events, self._budget)
            first = next(events, None)  # the next object's first event: is there one?
            run, batches = read_object(
                obj, k, k > 0 or first is not None, self._name, batch=self._batch
            )
            yield StreamedRun(run, batches, k > 0 or first is not None)
            del obj, run, batches
            k += 1

    def drain(self) -> None:
        """Read the rest of the file; ``StreamRefused`` when the streamed reader refuses it."""
        try:
            for _ in self._events:
                pass
        except ijson.JSONError as e:
            raise refused(e) from None


def _read_map(events: Iterator[Event], budget: EventBudget | None = None) -> dict[str, Any]:
    """A top-level object after its ``start_map``: the kept keys' values (``itls`` as
    ``FlatGaps``), in file order, the last value of a repeated key (as ``json``)."""
    d: dict[str, Any] = {}
    for ev, key in events:
        if ev == "end_map":
            return d
        first = next(events)
        if key == "itls":
            d[key] = _read_itls(first, events, budget)
        elif _kept(key):
            d[key] = build_value(first, events)
        else:
            skip_value(first, events)
    raise StreamRefused("the object ends early")


def _read_itls(
    first: Event, events: Iterator[Event], budget: EventBudget | None = None
) -> FlatGaps:
    """``itls``: a list of lists of numbers (ints >= 0, floats); anything else is refused
    (``json`` reads it and ``parse_vllm_result`` names the bad entry). Each gap is an event
    of the import: past the ``budget`` (``ImportTooLarge``) nothing more is read or kept."""
    if first[0] != "start_array":
        raise StreamRefused("itls is not a list")
    values = array("d")
    offsets = array("q", [0])
    append = values.append
    left = budget.left() if budget is not None else -1  # -1: no budget
    for ev, _ in events:
        if ev == "end_array":
            return FlatGaps(
                values=np.frombuffer(values, np.float64) if values else np.zeros(0),
                offsets=np.frombuffer(offsets, np.int64).copy(),
            )
        if ev != "start_array":
            raise StreamRefused("an itls entry that is not a list")
        for ev, val in events:
            if ev == "number" and (type(val) is float or val >= 0):
                append(val)
                left -= 1
                if left == -1 and budget is not None:  # one gap past the budget
                    raise budget.over()
            elif ev == "end_array":
                break
            else:
                raise StreamRefused("an itls entry that is not a list of numbers >= 0")
        offsets.append(len(values))
    raise StreamRefused("itls ends early")
