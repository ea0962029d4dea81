"""What each of a run's targets serves and which engine it is, read before the load: its
``/v1/models`` (``served_models``) and its identity (``server_identity``: ``/version``,
``/server_info`` or ``/get_server_info``, the model's ``max_model_len``), every target at
once (a thread each, at most ``MAX_THREADS``).

Stored in the run's load statistics: a run of one target as before (``served_models``, and
``server_identity`` flat); a run of several keeps, beside the first target's list in
``served_models`` (which compare's target key reads), each target's identity and list under
``server_identity.targets`` keyed by its base URL. Each model of the run (its mix, or its
one model) missing from a target's list is a validity note naming that target."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.client import served_models, server_identity
from app.client.served_models import ServedModels
from app.client.spec import RunSpec

MAX_THREADS = 8


@dataclass(frozen=True, slots=True)
class TargetIdentity:
    base_url: str
    served: ServedModels
    identity: dict[str, Any]


def fetch_one(spec: RunSpec, base: str) -> TargetIdentity:
    served = served_models.fetch(spec, base_url=base)
    lengths = served.max_model_len or {}
    ident = server_identity.fetch(spec, max_model_len=lengths.get(spec.model), base_url=base)
    return TargetIdentity(base, served, ident)


def not_asked(base: str, why: str) -> TargetIdentity:
    """A target that was sent nothing (``why``): its models unlisted, its identity unknown."""
    url = served_models.models_url(base)
    return TargetIdentity(base, ServedModels(url, None, f"not asked: {why}"), {"not_asked": why})


def fetch(spec: RunSpec, refused: Mapping[str, str] | None = None) -> list[TargetIdentity]:
    """Each target's, in the run's order (blocking: call it in a thread). A target in
    ``refused`` (base URL -> why) is not asked."""
    refused = refused or {}

    def one(base: str) -> TargetIdentity:
        why = refused.get(base)
        return not_asked(base, why) if why is not None else fetch_one(spec, base)

    targets = spec.targets()
    if len(targets) == 1:
        return [one(targets[0])]
    with ThreadPoolExecutor(min(MAX_THREADS, len(targets)), "identity") as pool:
        return list(pool.map(one, targets))


def models_of(spec: RunSpec) -> list[str]:
    """The run's models: its mix's, its own first."""
    others = [s.model for s in spec.model_mix if s.model != spec.model]
    return [spec.model, *others]


def record(
    load_stats: dict[str, Any], validity: list[str], spec: RunSpec, found: list[TargetIdentity]
) -> None:
    """The served models and identities into ``load_stats``; the notes into ``validity``."""
    first = found[0]
    served_models.record(load_stats, [], spec.model, first.served)
    models = models_of(spec)
    if len(found) == 1:
        load_stats[server_identity.STATS_KEY] = first.identity
        if first.served.ids is None:  # one note, not one per model of the mix
            validity.append(str(served_models.warning(spec.model, first.served)))
        else:
            validity += [n for m in models if (n := served_models.warning(m, first.served))]
        return
    targets: dict[str, Any] = {}
    for t in found:
        entry = dict(t.identity)
        entry[served_models.STATS_KEY] = t.served.ids
        if t.served.ids is None:
            entry["served_models_error"] = t.served.error
            validity.append(
                f"could not list the served models of {t.base_url} (GET {t.served.url}: "
                f"{t.served.error}): whether it serves "
                + ", ".join(repr(m) for m in models)
                + " is unchecked"
            )
        else:
            validity += [n for m in models if (n := served_models.warning(m, t.served, t.base_url))]
        targets[t.base_url] = entry
    load_stats[server_identity.STATS_KEY] = {"targets": targets}
