"""Baselines: named references to a run or a sweep, versioned (replacing keeps history),
optionally pinned (a pinned baseline is not replaced until unpinned)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.services.errors import Conflict, Invalid, NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.models_compare import Baseline

MAX_NAME = 255


@dataclass(frozen=True, slots=True)
class Target:
    run_id: str | None
    sweep_id: str | None

    @property
    def id(self) -> str:
        out = self.run_id or self.sweep_id
        assert out is not None
        return out


def baseline_dict(b: Baseline) -> dict[str, Any]:
    return {
        "name": b.name,
        "version": b.version,
        "run_id": b.run_id,
        "sweep_id": b.sweep_id,
        "pinned": b.pinned,
        "note": b.note,
        "created_at": b.created_at.isoformat(),
        "replaced_at": b.replaced_at.isoformat() if b.replaced_at else None,
    }


def check_name(name: str) -> str:
    clean = name.strip()
    if not clean or len(clean) > MAX_NAME:
        raise Invalid(f"name must have 1 to {MAX_NAME} characters", loc=("body", "name"))
    if "\x00" in clean:
        raise Invalid("name must not contain a NUL byte", loc=("body", "name"))
    return clean


def resolve_target(session: Session, target_id: str) -> Target:
    """A run id or a sweep id (404 when it is neither)."""
    if repo.find_run(session, target_id) is not None:
        return Target(target_id, None)
    if compare_repo.find_sweep(session, target_id) is not None:
        return Target(None, target_id)
    raise NotFound(f"no run or sweep with id {target_id!r}")


def save(
    session: Session, target_id: str, name: str, *, pin: bool = False, note: str | None = None
) -> dict[str, Any]:
    """Save ``target_id`` (run or sweep) as baseline ``name``; 409 when it is pinned."""
    clean = check_name(name)
    target = resolve_target(session, target_id)
    try:
        row = compare_repo.save_baseline(
            session, clean, run_id=target.run_id, sweep_id=target.sweep_id, pinned=pin, note=note
        )
    except compare_repo.PinnedError as e:
        raise Conflict(str(e)) from None
    return baseline_dict(row)


def current(session: Session, name: str) -> Baseline:
    row = compare_repo.current_baseline(session, name)
    if row is None:
        raise NotFound(f"no baseline named {name!r}")
    if row.run_id is None and row.sweep_id is None:
        raise Conflict(f"baseline {name!r} points at a run or sweep that was deleted")
    return row


def history(session: Session, name: str) -> list[dict[str, Any]]:
    rows = compare_repo.baseline_history(session, name)
    if not rows:
        raise NotFound(f"no baseline named {name!r}")
    return [baseline_dict(r) for r in rows]


def list_all(session: Session) -> list[dict[str, Any]]:
    return [baseline_dict(b) for b in compare_repo.list_baselines(session)]


def set_pin(session: Session, name: str, pinned: bool) -> dict[str, Any]:
    row = compare_repo.set_pinned(session, name, pinned)
    if row is None:
        raise NotFound(f"no baseline named {name!r}")
    return baseline_dict(row)
