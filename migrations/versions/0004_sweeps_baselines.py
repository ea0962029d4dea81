"""sweeps, sweep steps and baselines

Revision ID: 0004
Revises: 0002
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("loads", sa.JSON(), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
    )
    op.create_index("ix_sweeps_created_at", "sweeps", ["created_at"])
    op.create_table(
        "sweep_steps",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(32), nullable=False),
        sa.Column("step_idx", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("load", sa.Float(), nullable=False),
        sa.Column("load_kind", sa.String(16), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_sweep_steps_sweep_id_sweeps", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_sweep_steps_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_sweep_steps"),
        sa.UniqueConstraint("sweep_id", "step_idx", name="uq_sweep_steps_sweep_id_step_idx"),
        sa.UniqueConstraint("run_id", name="uq_sweep_steps_run_id"),
    )
    op.create_table(
        "baselines",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=True),
        sa.Column("sweep_id", sa.String(32), nullable=True),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replaced_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_baselines_run_id_runs", ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_baselines_sweep_id_sweeps", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_baselines"),
        sa.UniqueConstraint("name", "version", name="uq_baselines_name_version"),
    )
    op.create_index("ix_baselines_name", "baselines", ["name"])


def downgrade() -> None:
    op.drop_index("ix_baselines_name", table_name="baselines")
    op.drop_table("baselines")
    op.drop_table("sweep_steps")
    op.drop_index("ix_sweeps_created_at", table_name="sweeps")
    op.drop_table("sweeps")
