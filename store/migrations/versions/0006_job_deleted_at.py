"""A deleted job keeps its row as a tombstone: ``deleted_at`` says when its data went.

The row stays so that its id is never given to another job (SQLite reuses the highest
rowid once deleted) while the credit ledger names it (``job:<id>`` references).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deleted_at")
