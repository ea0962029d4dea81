"""initial schema: runs and requests

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("target_url", sa.Text(), nullable=True),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=True),
        sa.Column("client_version", sa.String(64), nullable=True),
        sa.Column("client_host", sa.String(255), nullable=True),
        sa.Column("clock_source", sa.String(16), nullable=True),
        sa.Column("start_mono_ns", sa.BigInteger(), nullable=True),
        sa.Column("client_limited", sa.Boolean(), nullable=False),
        sa.Column("validity", sa.JSON(), nullable=False),
        sa.Column("load_stats", sa.JSON(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("summary_only", sa.Boolean(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_created_at", "runs", ["created_at"])
    op.create_index("ix_runs_model", "runs", ["model"])

    op.create_table(
        "requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        sa.Column("scheduled_ns", sa.BigInteger(), nullable=False),
        sa.Column("sent_ns", sa.BigInteger(), nullable=True),
        sa.Column("end_ns", sa.BigInteger(), nullable=True),
        sa.Column("done_ns", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("tokenizer_output_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("usage_completion_tokens", sa.Integer(), nullable=True),
        sa.Column("token_source", sa.String(16), nullable=True),
        sa.Column("ttft_ns", sa.BigInteger(), nullable=True),
        sa.Column("ttfot_ns", sa.BigInteger(), nullable=True),
        sa.Column("e2e_ns", sa.BigInteger(), nullable=True),
        sa.Column("tpot_ns", sa.Float(), nullable=True),
        sa.Column("n_events", sa.Integer(), nullable=False),
        sa.Column("events", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_requests_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_requests"),
        sa.UniqueConstraint("run_id", "idx", name="uq_requests_run_id_idx"),
    )


def downgrade() -> None:
    op.drop_table("requests")
    op.drop_index("ix_runs_model", table_name="runs")
    op.drop_index("ix_runs_created_at", table_name="runs")
    op.drop_table("runs")
