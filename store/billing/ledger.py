"""Reading the credit ledger: an account's rows, its spending by day, and what is charged
and not yet given back under a reference.

The ledger is append-only (:mod:`verimail.store.billing.movements` writes it); a row's
``source`` is the pool that moved and ``balance_after`` that pool's balance right after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, Engine, func, select

from verimail.store.tables import credit_ledger


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row: ``delta`` > 0 adds, < 0 spends; ``balance_after`` is of ``source``'s pool."""

    id: int
    account_id: int
    delta: int
    kind: str
    source: str
    reason: str
    reference: str | None
    balance_after: int
    created_at: datetime


def ledger(engine: Engine, account_id: int, limit: int = 50, offset: int = 0) -> list[LedgerEntry]:
    """The account's ledger, newest first."""
    query = (
        select(credit_ledger)
        .where(credit_ledger.c.account_id == account_id)
        .order_by(credit_ledger.c.id.desc())
        .limit(limit)
        .offset(offset)
    )
    with engine.connect() as conn:
        return [LedgerEntry(**row._mapping) for row in conn.execute(query)]


def net_charged_in(conn: Connection, account_id: int, reference: str) -> int:
    """Credits charged under ``reference`` less those refunded under it."""
    total = conn.execute(
        select(func.coalesce(func.sum(credit_ledger.c.delta), 0)).where(
            credit_ledger.c.account_id == account_id,
            credit_ledger.c.reference == reference,
            credit_ledger.c.kind.in_(("charge", "refund")),
        )
    ).scalar_one()
    return -int(total)


def charges_under(engine: Engine, account_id: int, prefix: str) -> dict[str, int]:
    """Credits charged and not refunded per reference, for references starting with
    ``prefix`` (those with nothing left charged are left out)."""
    with engine.connect() as conn:
        return charges_under_in(conn, account_id, prefix)


def charges_under_in(conn: Connection, account_id: int, prefix: str) -> dict[str, int]:
    """:func:`charges_under` inside the caller's transaction."""
    rows = conn.execute(
        select(credit_ledger.c.reference, credit_ledger.c.delta).where(
            credit_ledger.c.account_id == account_id,
            credit_ledger.c.kind.in_(("charge", "refund")),
            credit_ledger.c.reference.startswith(prefix, autoescape=True),
        )
    ).all()
    spent: dict[str, int] = {}
    for reference, delta in rows:
        spent[reference] = spent.get(reference, 0) - delta
    return {reference: net for reference, net in spent.items() if net > 0}


SPENDING_KINDS = ("charge", "reserve", "refund")


def daily_spending(engine: Engine, account_id: int, days: int, *, today: date) -> list[int]:
    """Credits spent on each of the ``days`` days up to ``today`` (UTC), oldest first:
    charges and reservations less refunds (never below 0), summed by the database."""
    first = today - timedelta(days=days - 1)
    when = credit_ledger.c.created_at
    if engine.dialect.name == "postgresql":  # (date() of a timestamptz is the session's day)
        when = func.timezone("UTC", when)
    day = func.date(when)
    query = (
        select(day, func.sum(credit_ledger.c.delta))
        .where(
            credit_ledger.c.account_id == account_id,
            credit_ledger.c.kind.in_(SPENDING_KINDS),
            credit_ledger.c.created_at >= datetime.combine(first, time(), tzinfo=UTC),
        )
        .group_by(day)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    spent = {date.fromisoformat(str(when)[:10]): max(0, -int(total)) for when, total in rows}
    return [spent.get(first + timedelta(days=i), 0) for i in range(days)]


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
