"""GPU probes: probe results, their artifacts, job telemetry, run annotations

Revision ID: 0003_probes
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_probes"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROWID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "probes",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("device", sa.String(8), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("telemetry", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_probes_job_id_jobs", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_probes"),
    )
    op.create_index("ix_probes_created_at", "probes", ["created_at"])
    op.create_index("ix_probes_kind", "probes", ["kind"])

    op.create_table(
        "probe_artifacts",
        sa.Column("id", ROWID, autoincrement=True, nullable=False),
        sa.Column("probe_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("content_type", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["probe_id"],
            ["probes.id"],
            name="fk_probe_artifacts_probe_id_probes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_probe_artifacts"),
        sa.UniqueConstraint("probe_id", "name", name="uq_probe_artifacts_probe_id_name"),
    )

    op.create_table(
        "job_telemetry",
        sa.Column("id", ROWID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_telemetry_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_telemetry"),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_telemetry_job_id_seq"),
    )

    op.create_table(
        "run_annotations",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("model", sa.JSON(), nullable=False),
        sa.Column("device", sa.String(64), nullable=True),
        sa.Column("dtypes", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_annotations_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name="pk_run_annotations"),
    )


def downgrade() -> None:
    op.drop_table("run_annotations")
    op.drop_table("job_telemetry")
    op.drop_table("probe_artifacts")
    op.drop_index("ix_probes_kind", table_name="probes")
    op.drop_index("ix_probes_created_at", table_name="probes")
    op.drop_table("probes")
