"""Installation-wide figures for operators' metrics, read from the database (the credits'
figures are billing's: :func:`verimail.store.billing.credit_totals`).

Read at each scrape rather than counted in a process: every API process and worker writes
the same database, so these are right whichever process is scraped (and survive restarts).
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from verimail.store.tables import jobs


def jobs_by_state(engine: Engine) -> dict[tuple[str, str], int]:
    """(kind, status) -> number of jobs."""
    query = select(jobs.c.kind, jobs.c.status, func.count()).group_by(jobs.c.kind, jobs.c.status)
    with engine.connect() as conn:
        return {(kind, status): n for kind, status, n in conn.execute(query)}
