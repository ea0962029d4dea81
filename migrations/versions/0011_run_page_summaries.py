"""run page summaries: what a finished run's page shows (report metrics without SLOs, the
profiles' metrics, the figures' JSON, per-request values for goodput), computed once when
the run finalizes so a page view decodes no event; versioned, recomputed when stale

Revision ID: 0011
Revises: 0010
Create Date: 2027-02-15
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_page_summaries",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("n_requests", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("columns", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name="fk_run_page_summaries_run_id_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name="pk_run_page_summaries"),
    )


def downgrade() -> None:
    op.drop_table("run_page_summaries")
