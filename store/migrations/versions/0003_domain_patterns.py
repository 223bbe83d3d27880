"""Email Finder: local-part patterns learned per domain (pattern and counts, no address).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "domain_patterns",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("pattern", sa.String(64), nullable=False),
        sa.Column("finds", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_found_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("finds >= 0", name="ck_domain_patterns_finds_nonnegative"),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_domain_patterns_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("account_id", "domain", "pattern", name="pk_domain_patterns"),
    )
    op.create_index("ix_domain_patterns_domain", "domain_patterns", ["domain"])


def downgrade() -> None:
    op.drop_table("domain_patterns")
