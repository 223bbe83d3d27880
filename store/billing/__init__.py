"""Billing: every rule that moves credits, in one place.

What work costs (``prices.py``): 1 credit per address verified, duplicates included; a
finder lookup costs ``finder_charge`` only when it finds a verified address, else nothing.

When credits move:

* a synchronous request (verify one or a batch) is charged all or nothing *before* the work,
  under a reference of its own, and refunded if the work fails (``requests.py``; the API
  words it as a 402 in ``api/billing.py``). A single finder lookup is charged the same way,
  after the lookup and only for a find;
* a bulk or re-verification job reserves one credit per address in the transaction that
  creates it; completing it refunds what it did not use, failing it what it did not verify,
  in the transaction of that transition (``job_charges.py``, called by ``store/jobs.py``);
* a finder job reserves nothing: each find is charged once, under its row, as the run
  reports it, and given back if a later run no longer finds it or the job fails
  (``job_charges.py``; the run's side is ``jobs/finder_billing.py``).

Two pools (``pools.py``): the plan's allowance for the current day or month, spent first and
lapsing at the period's end, then prepaid credits (signup, operator grants), which never
expire. A refund goes back to the pool that paid (allowance only while its period lasts).

Which module does what: ``pools.py`` reads an account's pools and locks it;
``movements.py`` charges, reserves, refunds and grants, each one transaction with its
ledger rows; ``ledger.py`` reads the ledger; ``prices.py`` says how much; ``requests.py``
and ``job_charges.py`` are the rules above for requests and jobs.

This module is the door: every surface (the API, the command line, the job service, the
flows) takes billing's names from here, never from a submodule (``tests/test_architecture.py``
checks it), so no rule of credits is written outside this folder. Only the store's own
transitions (``store/jobs.py``, ``store/accounts.py``) reach in, for the ``*_in`` steps
that run inside their transactions. The door, by what it does:

* **quote** — :func:`quote` (what work costs), :func:`balance`, :func:`short_balance` (the
  balance when it cannot pay, so work is refused before it starts);
* **reserve** — a job's reservation is made with its row (``store/jobs.py``);
* **settle** — :func:`charge_request` (a request, before its work), :func:`charge_for_run`
  (a finder run's find, once per row);
* **refund** — :func:`refund_request`, :func:`refund_for_run`;
* **cancel** — :func:`cancel_refund` (what a job its owner stops gives back);
* and around them: :func:`grant`, the ledger (:func:`ledger`, :func:`daily_spending`,
  :func:`charges_under`, :func:`credit_totals`) and a finder job's references.
"""

from verimail.store.billing.job_charges import (
    cancel_refund,
    charge_for_run,
    finder_references,
    finder_row_reference,
    refund_for_run,
)
from verimail.store.billing.ledger import (
    LedgerEntry,
    charges_under,
    credit_totals,
    daily_spending,
    ledger,
)
from verimail.store.billing.movements import grant
from verimail.store.billing.pools import AccountNotFound, Balance, balance, short_balance
from verimail.store.billing.prices import price as quote
from verimail.store.billing.requests import charge_request, refund_request

__all__ = [
    "AccountNotFound",
    "Balance",
    "LedgerEntry",
    "balance",
    "cancel_refund",
    "charge_for_run",
    "charge_request",
    "charges_under",
    "credit_totals",
    "daily_spending",
    "finder_references",
    "finder_row_reference",
    "grant",
    "ledger",
    "quote",
    "refund_for_run",
    "refund_request",
    "short_balance",
]
