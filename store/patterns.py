"""Email Finder: which local-part patterns were found at each domain, and how often.

One row per (account, domain, pattern) with a count: never an address or a name, so what
is learned from one account's finds can serve every account (``finder_pattern_scope``) and
the account whose find taught it stays unknown. Counted per account all the same, so the
scope is a setting that can change either way without losing or mixing anything.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from verimail.store.db import utcnow, write_tx
from verimail.store.tables import domain_patterns


def record_find(engine: Engine, account_id: int, domain: str, pattern: str) -> None:
    """Count one find of ``pattern`` at ``domain`` for ``account_id`` (an upsert: two finds
    at once both count)."""
    now = utcnow()
    with write_tx(engine) as conn:
        dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        stmt = dialect_insert(domain_patterns).values(
            account_id=account_id, domain=domain, pattern=pattern, finds=1, last_found_at=now
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[
                    domain_patterns.c.account_id,
                    domain_patterns.c.domain,
                    domain_patterns.c.pattern,
                ],
                set_={"finds": domain_patterns.c.finds + 1, "last_found_at": now},
            )
        )


def pattern_counts(engine: Engine, domain: str, account_id: int | None) -> dict[str, int]:
    """Finds per pattern at ``domain``: of ``account_id`` only, or of every account (None)."""
    query = (
        select(domain_patterns.c.pattern, func.sum(domain_patterns.c.finds))
        .where(domain_patterns.c.domain == domain)
        .group_by(domain_patterns.c.pattern)
    )
    if account_id is not None:
        query = query.where(domain_patterns.c.account_id == account_id)
    with engine.connect() as conn:
        return {pattern: int(n) for pattern, n in conn.execute(query) if n}
