"""``tokentrace worker --processes``: the load processes this worker gives a run whose spec
leaves ``processes`` at 1 (``app.client.shards``). A spec that asks for another count keeps
it; a run that cannot be dealt (a session or agent-trace dataset, server controls) keeps one
process and its notes say why. The run's notes say the worker dealt it."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from app.client.spec import RunSpec

Processes = int | Literal["auto"]


def parse_processes(text: str) -> Processes:
    """``--processes``' value: a whole number from 1 to 1024, or ``auto`` (ValueError)."""
    value: object = text.strip()
    if value != "auto":
        try:
            value = int(str(value))
        except ValueError:
            raise ValueError("a whole number from 1 to 1024, or auto") from None
    try:
        return RunSpec.model_validate(
            {"base_url": "http://127.0.0.1:1", "model": "m", "processes": value}
        ).processes
    except ValidationError as e:
        raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None


def with_worker_processes(spec: RunSpec, processes: Processes | None) -> tuple[RunSpec, str | None]:
    """``spec`` as this worker runs it, and the note the run gets (None: nothing changed)."""
    if processes is None or processes == 1 or spec.processes != 1:
        return spec, None
    values = dict(spec.__dict__) | {"processes": processes}
    try:
        dealt = RunSpec.model_validate(values)
    except ValidationError as e:
        why = e.errors()[0]["msg"].removeprefix("Value error, ")
        return spec, f"one load process, not the worker's --processes {processes}: {why}"
    return dealt, f"dealt over the worker's --processes {processes} (the run asked for one)"
