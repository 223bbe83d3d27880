"""The verify pipeline: one pass over a list of addresses, as Prefect tasks.

Every flow that verifies addresses runs this one loop — a bulk job's first pass and its
deferred retry passes (``flows/bulk.py``) and a re-verification (``flows/reverify.py``):

1. ``prepare-addresses``: syntax, lists, DNS once per domain, the SMTP work grouped by mail
   host (``Engine.prepare``);
2. host groups of more than :data:`PIECE_ADDRESSES` recipients cut into pieces, and the
   groups dealt into chunks (:func:`~verimail.tasks.verify.chunk_groups`);
3. a ``verify-host-groups`` task per chunk, all at once; as each ends, its findings are
   absorbed and its addresses settled (``Engine.as_settled``, the loop ``Engine.stream``
   uses too).

:func:`verify_pass` hands over the results batch by batch as they are known — first the
addresses decided without SMTP, then each chunk's — and forgets them: a caller that writes
each batch away holds the work still to do, never the whole list's results.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping

from verimail.config import current_settings
from verimail.engine import EngineStats, SmtpShare, shared_engine
from verimail.schemas.results import VerificationResult
from verimail.tasks.verify import chunk_groups, prepare_addresses, verify_host_groups

log = logging.getLogger(__name__)

PIECE_ADDRESSES = 2_000
"""A host group of more recipients is verified in pieces of this many
(``Prepared.split_groups``), each settled — and counted in a job's progress — as soon as its
task is done: a list on one big provider would otherwise show 0% until the very end."""

Settled = list[tuple[str, VerificationResult]]
"""A batch of results: each submitted string with its result."""


async def verify_pass(
    addresses: Iterable[str],
    *,
    what: str,
    stats: EngineStats | None = None,
    greylist_retries: int | None = None,
    egresses: Mapping[str, str] | None = None,
) -> AsyncIterator[Settled]:
    """Verify ``addresses`` (each distinct string once) as Prefect tasks, batch by batch.

    ``what`` names the work in the run's log (``job 12``); ``stats``, when given, is filled
    in; ``greylist_retries`` overrides the setting for the in-pass greylisting retries
    (0: a greylisted recipient is answered at once, for a deferred pass to ask again);
    ``egresses`` names the egress a domain must leave through (a deferred pass: its first
    try's, since greylisting keys on the client address)."""
    engine = shared_engine(current_settings())
    prepared = await prepare_addresses(list(addresses))
    if stats is not None:  # (the caller's record from now on: SMTP adds to it as it goes)
        for name in EngineStats.__dataclass_fields__:
            setattr(stats, name, getattr(prepared.stats, name))
        prepared.stats = stats
    prepared.split_groups(PIECE_ADDRESSES)
    if egresses:
        prepared.pin_egresses(egresses)
    chunks = chunk_groups(prepared.groups)
    _log(
        "%s: %s unique addresses, %s domains, %s host groups in %s tasks",
        what,
        prepared.stats.unique_addresses,
        prepared.stats.domains,
        len(prepared.groups),
        len(chunks),
    )
    yield list(engine.settle(prepared, prepared.decided_inputs()))
    prepared.groups = []  # (the chunks hold them now)
    shares = [
        SmtpShare(chunk, verify_host_groups(chunk, greylist_retries=greylist_retries))
        for chunk in chunks
    ]
    del chunks
    async for settled in engine.as_settled(prepared, shares):
        yield list(settled)


def _log(message: str, *args: object) -> None:
    """Into the flow run's log (the Prefect UI shows it), or this module's outside a run."""
    try:
        from prefect import get_run_logger

        get_run_logger().info(message, *args)
    except Exception:  # (no run here)
        log.info(message, *args)
