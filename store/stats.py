"""Installation-wide figures for operators' metrics, read from the database.

Read at each scrape rather than counted in a process: every API process and worker writes
the same database, so these are right whichever process is scraped (and survive restarts).
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from verimail.store.tables import credit_ledger, jobs


def jobs_by_state(engine: Engine) -> dict[tuple[str, str], int]:
    """(kind, status) -> number of jobs."""
    query = select(jobs.c.kind, jobs.c.status, func.count()).group_by(jobs.c.kind, jobs.c.status)
    with engine.connect() as conn:
        return {(kind, status): n for kind, status, n in conn.execute(query)}


def credit_totals(engine: Engine) -> dict[str, int]:
    """Credits ever charged (charges and job reservations) and refunded, all accounts."""
    charged = func.coalesce(func.sum(-credit_ledger.c.delta), 0)
    refunded = func.coalesce(func.sum(credit_ledger.c.delta), 0)
    with engine.connect() as conn:
        spent = conn.execute(
            select(charged).where(credit_ledger.c.kind.in_(("charge", "reserve")))
        ).scalar_one()
        back = conn.execute(select(refunded).where(credit_ledger.c.kind == "refund")).scalar_one()
    return {"charged": int(spent), "refunded": int(back)}
