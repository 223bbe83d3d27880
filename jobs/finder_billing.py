"""A finder job's pay-as-you-go: the :class:`~verimail.tasks.finder.Billing` the
``find-emails`` flow hands its lookups.

Each verified find is charged on its own (atomically), under its row, at most once whichever
run reports it (the rule and its references: ``store/billing/job_charges.py``). After the
first refusal every row not yet paid for is skipped. A run that resumes the job after its
runner died learns what earlier runs paid for (:meth:`FinderBilling.load`) and pays nothing
for those rows again.
"""

from __future__ import annotations

import asyncio

from verimail.jobs.context import db_retried
from verimail.jobs.heartbeat import Superseded
from verimail.store import billing
from verimail.store import jobs as job_store
from verimail.store.db import Store


class FinderBilling:
    """Charges finds one by one, each row at most once across runs; after the first refusal
    every row not yet paid for is skipped."""

    def __init__(self, store: Store, job: job_store.Job, price: int) -> None:
        self.store = store
        self.job = job
        self.price = price
        self.exhausted = False
        self.paid: dict[int, int] = {}  # row -> what its find was charged (this run or before)
        self.lock = asyncio.Lock()

    def _reference(self, row: int) -> str:
        return billing.finder_row_reference(self.job.id, row)

    @property
    def _prefix(self) -> str:
        return billing.finder_references(self.job.id)

    async def load(self) -> None:
        """What earlier runs of this job paid for (a resumed job)."""
        spent = await asyncio.to_thread(
            billing.charges_under, self.store.engine, self.job.account_id, self._prefix
        )
        self.paid = {int(ref.removeprefix(self._prefix)): amount for ref, amount in spent.items()}

    @property
    def used(self) -> int:
        """Credits the job's finds cost so far (the ledger's charges under its rows)."""
        return sum(self.paid.values())

    def skips(self, row: int) -> bool:
        """Out of credits, and this row was not paid for before."""
        return self.exhausted and row not in self.paid

    async def pay(self, row: int, email: str) -> bool:
        """Charge the find on ``row`` (once, whichever run reports it); False when the
        account is out of credits. Raises :class:`Superseded` when a later run has the job
        (checked in the charge's own transaction)."""
        async with self.lock:
            if row in self.paid:
                return True
            if self.exhausted:
                return False
            outcome = await db_retried(
                billing.charge_for_run,
                self.store.engine,
                self.job,
                self.price,
                reason=f"email finder: {email}",
                reference=self._reference(row),
            )
            if outcome == "superseded":
                raise Superseded(f"job {self.job.id}: run {self.job.attempt} lost it")
            if outcome == "short":
                self.exhausted = True
                return False
            # ("already": a charge of this run whose commit a retried call did not see)
            self.paid[row] = self.price
            return True

    async def unpay(self, row: int) -> None:
        """This run did not find the row an earlier run paid for (its runner died after
        the charge): a find is charged only when one is reported, so give the charge back."""
        async with self.lock:
            if row not in self.paid:
                return
            given = await db_retried(
                billing.refund_for_run,
                self.store.engine,
                self.job,
                reference=self._reference(row),
                reason=f"email finder: job {self.job.public_id} row {row + 1} not found "
                "when resumed",
            )
            if given == "superseded":
                raise Superseded(f"job {self.job.id}: run {self.job.attempt} lost it")
            del self.paid[row]  # (given back now, or by a retried call that committed)
