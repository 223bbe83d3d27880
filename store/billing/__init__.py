"""Billing: every rule that moves credits, in one place.

Which module does what: ``pools.py`` reads an account's pools (the plan's allowance, spent
first, and prepaid credits) and locks it; ``movements.py`` charges, reserves, refunds and
grants, each one transaction with its ledger rows; ``ledger.py`` reads the ledger;
``prices.py`` says how much; ``requests.py`` is a synchronous request's charge;
``job_charges.py`` is a job's: its reservation, the refunds of its completion or failure
(called by ``store/jobs.py`` in the transition's transaction), a finder run's finds.
"""
