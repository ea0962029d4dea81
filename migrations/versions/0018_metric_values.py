"""requests: ``metric_values``, each request's values of the registry's per-request metrics
that are read from its events and have no column of their own (``Metric.column`` None), as
JSON: metric key -> value in the metric's base unit (ns); NULL when the request has none
(every request of every earlier run, and every request while no such metric exists). A new
metric of that kind is stored here with no further migration.

Revision ID: 0018
Revises: 0017
Create Date: 2027-04-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("metric_values", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("metric_values")
