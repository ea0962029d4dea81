"""Credentials (``user:password@``) in a stored URL are dropped: runs' ``target_url`` and
their spec's ``base_url`` / ``metrics_url``, jobs' specs (a sweep job's under ``bench``)
and sweeps' specs. They were accepted before and then stored and listed with the run; a
run spec now refuses them (422 naming the field) and an import drops them. The downgrade
changes nothing: what was dropped is not kept anywhere.

Revision ID: 0014
Revises: 0013
Create Date: 2027-03-20
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the same rule as app.client.spec.without_credentials (a migration keeps its own copy)
_CREDENTIALS = re.compile(r"(?<=://)[^/?#]*@")
URL_KEYS = ("base_url", "metrics_url")
TABLES = {"runs": ("spec", "target_url"), "jobs": ("spec",), "sweeps": ("spec",)}


def _url(value: Any) -> Any:
    return _CREDENTIALS.sub("", value, count=1) if isinstance(value, str) else value


def _spec(spec: Any) -> Any:
    """A copy of a spec with its URLs cleaned (a sweep job's bench spec too)."""
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    for key in URL_KEYS:
        if key in out:
            out[key] = _url(out[key])
    if isinstance(out.get("bench"), dict):
        out["bench"] = _spec(out["bench"])
    return out


def upgrade() -> None:
    bind = op.get_bind()
    for name, cols in TABLES.items():
        table = sa.table(
            name,
            sa.column("id", sa.String),
            *(sa.column(c, sa.JSON if c == "spec" else sa.Text) for c in cols),
        )
        may_hold = sa.or_(*(sa.cast(table.c[c], sa.Text).like("%://%@%") for c in cols))
        for row in bind.execute(sa.select(table).where(may_hold)).mappings().all():
            changed = {}
            for c in cols:
                clean = _spec(row[c]) if c == "spec" else _url(row[c])
                if clean != row[c]:
                    changed[c] = clean
            if changed:
                bind.execute(table.update().where(table.c.id == row["id"]).values(**changed))


def downgrade() -> None:
    """Nothing to restore."""
