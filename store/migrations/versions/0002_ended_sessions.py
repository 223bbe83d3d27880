"""Dashboard sessions ended by logging out.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ended_sessions",
        sa.Column("sid_hash", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sid_hash", name="pk_ended_sessions"),
    )
    op.create_index("ix_ended_sessions_expires_at", "ended_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("ended_sessions")
