"""imports (the file's own figures) and server metrics scraped during runs

Revision ID: 0005
Revises: 0002
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_imports",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("profile", sa.String(32), nullable=True),
        sa.Column("file_name", sa.String(255), nullable=True),
        sa.Column("group_id", sa.String(32), nullable=False),
        sa.Column("group_index", sa.Integer(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_imports_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name="pk_run_imports"),
    )
    op.create_index("ix_run_imports_group_id", "run_imports", ["group_id"])
    op.create_table(
        "server_metric_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=True),
        sa.Column("t_ns", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name="fk_server_metric_samples_run_id_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_server_metric_samples"),
    )
    op.create_index(
        "ix_server_metric_samples_run_id_name", "server_metric_samples", ["run_id", "name"]
    )


def downgrade() -> None:
    op.drop_index("ix_server_metric_samples_run_id_name", table_name="server_metric_samples")
    op.drop_table("server_metric_samples")
    op.drop_index("ix_run_imports_group_id", table_name="run_imports")
    op.drop_table("run_imports")
