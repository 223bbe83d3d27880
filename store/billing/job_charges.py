"""What a job's credits do: the reservation made with the row, the refunds its completion or
failure gives back, and the finds a finder run pays for as it goes.

A bulk or re-verification job reserves at creation, under ``job:<id>``, in the *same*
transaction that inserts it (:func:`reserve_in`, called by :func:`verimail.store.jobs.create_job`),
so there is never a job without its reservation nor a reservation without its job. What it
does not use comes back (:func:`refund_reservation_in`) in the same transaction as its final
transition; the job row's ``credits_refunded`` records it and a CHECK keeps it within
``credits_reserved``, so no job refunds twice or more than it reserved.

A finder job reserves nothing: each verified find is charged once, under its row
(:func:`finder_row_reference`), by the run that reports it (:func:`charge_for_run`), and
given back if a later run no longer finds it (:func:`refund_for_run`) or the job fails
(:func:`refund_finds_in`: a failed job reports no finds, a cancelled one only those of its
partial results).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, Engine, Row

from verimail.store.billing.ledger import charges_under_in
from verimail.store.billing.movements import (
    ChargeOutcome,
    charge_in,
    charge_once_in,
    refund_in,
    refund_once_in,
)
from verimail.store.db import write_tx
from verimail.store.job_lock import run_has_job

if TYPE_CHECKING:  # (store/jobs.py calls this module within its transitions)
    from verimail.store.jobs import Job


def job_reference(job_id: int) -> str:
    """The ledger reference of a job's reservation and of its refunds."""
    return f"job:{job_id}"


# --- a job's reservation -----------------------------------------------------------------------


def reserve_in(
    conn: Connection,
    account_id: int,
    job_id: int,
    amount: int,
    *,
    reason: str,
    now: datetime,
) -> bool:
    """Reserve ``amount`` for the new job ``job_id`` inside the transaction that inserts it;
    False (nothing written) when the account cannot cover it."""
    return charge_in(
        conn,
        account_id,
        amount,
        kind="reserve",
        reason=reason,
        reference=job_reference(job_id),
        now=now,
    )


def refund_reservation_in(
    conn: Connection, job: Row[Any], amount: int, why: str, now: datetime
) -> int:
    """Refund up to ``amount`` of the (locked) job's unrefunded reservation; returns what was
    refunded."""
    amount = max(min(amount, job.credits_reserved - job.credits_refunded), 0)
    if amount:
        refund_in(
            conn,
            job.account_id,
            amount,
            reason=f"{job.kind} job {job.id}: {why}",
            reference=job_reference(job.id),
            now=now,
        )
    return amount


def cancel_refund(job: Job, settled: int) -> int:
    """What a bulk job its owner stops gives back: its unrefunded reservation but the
    ``settled`` rows it keeps (in its partial results), never below nothing."""
    unsettled = job.credits_reserved - job.credits_refunded - settled
    return max(unsettled, 0)


# --- a finder job's finds -----------------------------------------------------------------------


def finder_row_reference(job_id: int, row: int) -> str:
    """The ledger reference a finder job's find on ``row`` is charged under (once)."""
    return f"{finder_references(job_id)}{row}"


def finder_references(job_id: int) -> str:
    """What every find charge of a finder job's reference starts with."""
    return f"{job_reference(job_id)}:row:"


def charge_for_run(
    engine: Engine,
    job: Job,
    amount: int,
    *,
    reference: str,
    reason: str = "",
) -> ChargeOutcome | Literal["superseded"]:
    """:func:`~verimail.store.billing.movements.charge_once` for the job's run
    ``job.attempt``, in one transaction with the check that the run still has the job: a
    run taken for dead that wakes up must not pay for finds the run that has the job may not
    report. "superseded" (nothing charged) when it no longer has it."""
    with write_tx(engine) as conn:
        if not run_has_job(conn, job.id, job.attempt):
            return "superseded"
        return charge_once_in(conn, job.account_id, amount, reference=reference, reason=reason)


def refund_for_run(
    engine: Engine, job: Job, *, reference: str, reason: str
) -> int | Literal["superseded"]:
    """:func:`~verimail.store.billing.movements.refund_once` for the job's run
    ``job.attempt``, only while it still has the job (a superseded run would give back a
    find the later run paid for and reports); the credits given back, or "superseded"."""
    with write_tx(engine) as conn:
        if not run_has_job(conn, job.id, job.attempt):
            return "superseded"
        return refund_once_in(conn, job.account_id, reference=reference, reason=reason)


def refund_finds_in(
    conn: Connection, job: Row[Any], now: datetime, keep: Collection[int] = ()
) -> int:
    """Give back every find a failed finder job charged, but those on the rows in ``keep``;
    the credits the kept finds cost. A find is charged only when it is reported: a failed
    job reports none (its results are not written), a job its owner stopped reports the
    finds of its partial results (``jobs/cancel.py``), and only those."""
    kept = {finder_row_reference(job.id, row) for row in keep}
    charged = charges_under_in(conn, job.account_id, finder_references(job.id))
    for reference in charged.keys() - kept:
        refund_once_in(
            conn,
            job.account_id,
            reference=reference,
            reason="refund of a failed finder job (its finds are not reported)",
            now=now,
        )
    return sum(amount for reference, amount in charged.items() if reference in kept)
