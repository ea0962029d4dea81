"""sweeps: ``find_max``, a find-max sweep's search (``app.analysis.slo_search.FindMax``
as JSON: the load kind, its SLOs, the confidence, the step budget and the load range);
NULL for every other sweep. The answer is recomputed from the steps when read.

Revision ID: 0020
Revises: 0019
Create Date: 2027-05-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("find_max", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("find_max")
