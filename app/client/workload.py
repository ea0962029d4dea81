"""The run's workload: its dataset type builds the warm-up and measured prompts, its API
surface makes them its requests (``app.client.endpoints``: batched, checked)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.client.datasets import dataset_type, parse_options
from app.client.datasets.base import AnyTokenizer, BuildContext, Workload, dataset_errors
from app.client.endpoints import ENDPOINTS
from app.client.spec import RunSpec


def build_workload(
    spec: RunSpec,
    tok: AnyTokenizer,
    *,
    dataset_dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Workload:
    """Requests for a run (``dataset_dirs``: see ``open_dataset``; ``cancelled``: polled,
    ``WorkloadCancelled``); a dataset, or a surface, that refuses raises ``DatasetError``."""
    kind = dataset_type(spec.dataset)
    options = parse_options(kind, spec.dataset_options)
    surface, surface_options = spec.surface()
    ctx = BuildContext(tok, dataset_dirs, cancelled)
    with dataset_errors():
        prompts = kind.build(spec.workload_params(), options, ctx)
        if not surface.parts:
            _refuse_chat_fields(prompts, surface.name)
        return surface.requests(prompts, surface_options)


def _refuse_chat_fields(workload: Workload, endpoint: str) -> None:
    """Tools and images go in a chat request: a surface that takes no conversation refuses
    a dataset line that carries them, naming the file and the endpoint."""
    for p in (*workload.warmup, *workload.measured):
        if p.body_fields or p.images:
            what = "images" if p.images else "tools"
            takes = " or ".join(repr(k) for k, e in ENDPOINTS.items() if e.parts)
            raise ValueError(
                f"dataset_path: a line has {what!r} (for a chat request); endpoint "
                f"{endpoint!r} does not send them: endpoint must be {takes}"
            )
