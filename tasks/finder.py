"""The Prefect task of a finder CSV run, a thin unit over the engine: look up the people of
several domains. ``find-emails`` composes it.

Rows are grouped by their normalised domain (:func:`by_domain`); a task works several
domains concurrently (bounded), the rows of one domain one after the other over one shared
SMTP session (``DomainSession``): the domain's DNS facts are resolved once, the catch-all
probe is sent once, and every person's candidates go over the same connection. On a
catch-all domain the other rows get their most likely pattern without any RCPT. Each find
teaches the domain's pattern (``patterns``): the rows after it try that pattern first.

What a row's outcome does to the job is the flow's: the task is handed a :class:`Billing`
(charge a find, or learn that the account cannot pay) and :class:`Outcomes` (where each
row's outcome goes), and never touches the store itself.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from verimail.config import Settings, current_settings
from verimail.engine import (
    DomainSession,
    FinderInputError,
    PatternMemory,
    find_email,
    normalise_finder_domain,
    shared_engine,
)

DOMAINS_PER_TASK = 50
DOMAIN_CONCURRENCY = 20  # domains looked up at once within a task

Person = dict[str, Any]
"""A row of the upload: ``row`` (0-based), ``first_name``, ``last_name``, ``domain``."""


class Billing(Protocol):
    """Charges finds, each row at most once."""

    def skips(self, row: int) -> bool:
        """Out of credits, and this row was not paid for before: do not look it up."""
        ...

    async def pay(self, row: int, email: str) -> bool:
        """Charge the find on ``row``; False when the account cannot pay for it."""
        ...

    async def unpay(self, row: int) -> None:
        """``row`` is not found now: give back what an earlier run charged for it."""
        ...


class Outcomes(Protocol):
    """Where each row's outcome goes as it comes."""

    def record(
        self,
        row: int,
        email: str | None,
        status: str,
        confidence: float,
        unchecked: str | None = None,
    ) -> None:
        """``unchecked``: a ``not_found`` whose server could not be checked, what it did."""
        ...

    async def tick(self) -> None:
        """A row is done (show progress now and then)."""
        ...

    async def flush(self) -> None:
        """Show progress now."""
        ...


def domain_key(raw: str | None) -> str:
    """Rows group by their normalised domain (``https://www.acme.test/`` is ``acme.test``),
    so one company's rows share one session whatever way each row spells it."""
    try:
        return normalise_finder_domain(raw or "")
    except FinderInputError:
        return (raw or "").lower()  # find_email refuses it again, row by row


def task_shares(people: Iterable[Person]) -> list[list[list[Person]]]:
    """The rows grouped by domain and dealt to tasks of at most :data:`DOMAINS_PER_TASK`
    domains each."""
    groups: dict[str, list[Person]] = defaultdict(list)
    for person in people:
        groups[domain_key(person["domain"])].append(person)
    domains = list(groups.values())
    n_tasks = max(1, math.ceil(len(domains) / DOMAINS_PER_TASK))
    return [domains[i::n_tasks] for i in range(n_tasks)]


@task(name="find-domains", persist_result=False, cache_policy=NO_CACHE)
async def find_domains(
    by_domain: list[list[Person]],
    billing: Billing,
    outcomes: Outcomes,
    patterns: PatternMemory,
    *,
    open_greylist: bool = False,
) -> int:
    """Look up the rows of several domains (bounded concurrency); returns rows done.

    ``open_greylist``: a later pass will retry what the servers put off, so a greylisting
    server is asked every candidate now (see ``DomainSession``)."""
    settings = current_settings()
    gate = asyncio.Semaphore(DOMAIN_CONCURRENCY)

    async def one(rows: list[Person]) -> None:
        async with gate:
            await _domain(settings, rows, billing, outcomes, patterns, open_greylist)

    await asyncio.gather(*(one(rows) for rows in by_domain))
    await outcomes.flush()
    return sum(len(rows) for rows in by_domain)


async def _domain(
    settings: Settings,
    rows: list[Person],
    billing: Billing,
    outcomes: Outcomes,
    patterns: PatternMemory,
    open_greylist: bool,
) -> None:
    """Every row of one domain, in order, over one shared SMTP session; each find teaches
    the rows after it the domain's pattern."""
    engine = shared_engine(settings)
    async with DomainSession(engine.prober, open_greylist=open_greylist) as session:
        for row in rows:
            first, last, domain = row["first_name"], row["last_name"], row["domain"]
            if not (first and last and domain):
                outcomes.record(row["row"], None, "invalid_input", 0.0)
                continue
            if billing.skips(row["row"]):
                outcomes.record(row["row"], None, "skipped_no_credits", 0.0)
                continue
            try:
                result = await find_email(
                    engine,
                    first,
                    last,
                    domain,
                    max_probes=settings.finder_max_probes,
                    session=session,
                    patterns=patterns,
                )
            except FinderInputError:
                outcomes.record(row["row"], None, "invalid_input", 0.0)
                continue
            if result.found and result.email:
                if await billing.pay(row["row"], result.email):
                    outcomes.record(row["row"], result.email, "found", result.confidence)
                else:
                    outcomes.record(row["row"], None, "skipped_no_credits", 0.0)
                await outcomes.tick()
                continue
            await billing.unpay(row["row"])
            unchecked = result.unchecked.value if result.unchecked is not None else None
            outcomes.record(row["row"], result.email, result.status, result.confidence, unchecked)
            await outcomes.tick()
