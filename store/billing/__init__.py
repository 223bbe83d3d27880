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
"""
