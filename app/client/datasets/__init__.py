"""Dataset types, found by name (``DATASETS``): each is one module implementing
``DatasetType`` (``base.py``): its own spec fields (``options``, given in
``RunSpec.dataset_options``), their checks, and how it builds the run's prompts.

Adding a dataset type: a module here (with its tests) and its line in ``DATASETS``; the
CLI's ``--dataset-name``, the API schema and the launch form read this registry.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from app.client.datasets.agentic import AGENTIC
from app.client.datasets.base import DatasetType
from app.client.datasets.jsonl import JSONL
from app.client.datasets.mooncake import MOONCAKE
from app.client.datasets.otel import OTEL
from app.client.datasets.prefix_repetition import PREFIX_REPETITION
from app.client.datasets.random import RANDOM
from app.client.datasets.random_mm import RANDOM_MM
from app.client.datasets.sharegpt import SHAREGPT
from app.client.datasets.timed_jsonl import TIMED_JSONL
from app.client.datasets.weka import WEKA

DATASETS: dict[str, DatasetType] = {
    d.name: d
    for d in (
        RANDOM, JSONL, SHAREGPT, PREFIX_REPETITION, MOONCAKE, TIMED_JSONL, RANDOM_MM, AGENTIC,
        OTEL, WEKA,
    )
}  # fmt: skip


# the run spec's field descriptions (the API schema and the CLI's help)
DATASET_HELP = "a dataset type: " + "; ".join(f"{k}: {d.summary}" for k, d in DATASETS.items())
DATASET_OPTIONS_HELP = (
    "the dataset type's own fields, by name ("
    + "; ".join(
        f"{k}: {', '.join(d.options.model_fields)}"
        for k, d in DATASETS.items()
        if d.options.model_fields
    )
    + "); another type's or an unknown field is refused (422 naming "
    "dataset_options.<field>); see docs/workloads.md"
)


def dataset_type(name: str) -> DatasetType:
    """The registered type ``name`` (a ``ValueError`` lists the known ones)."""
    try:
        return DATASETS[name]
    except KeyError:
        known = ", ".join(DATASETS)
        raise ValueError(f"dataset: unknown dataset type {name!r} (one of: {known})") from None


def parse_options(kind: DatasetType, raw: dict[str, Any]) -> BaseModel:
    """``raw`` as the type's options; a ``ValueError`` names the first bad field as
    ``dataset_options.<field>``."""
    try:
        return kind.options.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        field = f"dataset_options.{where}" if where else "dataset_options"
        raise ValueError(f"{field}: {err.get('msg')} (dataset {kind.name!r})") from None
