"""A big job's shards: one row each, for the workers that verify them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_shards",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("addresses", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("processed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("counts", sa.Text(), nullable=True),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'running', 'done')", name="ck_job_shards_status"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_shards_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "shard", name="pk_job_shards"),
    )
    op.create_index("ix_job_shards_status_heartbeat_at", "job_shards", ["status", "heartbeat_at"])


def downgrade() -> None:
    op.drop_table("job_shards")
