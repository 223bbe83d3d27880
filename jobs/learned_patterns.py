"""The finder's learned domain patterns as a lookup reads and teaches them.

Shared by the API's single finds and the finder CSV flow, so it imports no Prefect: the
API process must not import Prefect before ``verimail serve --prefect-ui-port`` has pointed
Prefect's client at the UI server it starts (see ``runners/prefect_ui.py``).
"""

from __future__ import annotations

import asyncio
import logging

import duckdb
from sqlalchemy.exc import SQLAlchemyError

from verimail.config import Settings
from verimail.engine import DomainPattern
from verimail.files.history import valid_locals
from verimail.jobs.context import db_retried
from verimail.store import patterns as pattern_store
from verimail.store.db import Store

log = logging.getLogger(__name__)


class StoredPatterns:
    """The learned domain patterns in the store, as a lookup reads and teaches them
    (:class:`~verimail.engine.finder_learned.PatternMemory`).

    Finds are counted under ``account_id``; lookups read every account's counts or this
    account's only, as ``finder_pattern_scope`` says. A domain read once is kept here and
    updated by this object's own finds, so a CSV job's rows learn from the rows before them
    without a read per row. A database error never fails a lookup: it is logged, and the
    lookup goes on without the learned pattern (or without teaching it).
    """

    def __init__(self, store: Store, account_id: int, settings: Settings) -> None:
        self.store = store
        self.account_id = account_id
        self.shared = settings.finder_pattern_scope == "all"
        self.data_dir = settings.data_dir
        self._known: dict[str, DomainPattern] = {}
        self._valid: dict[str, frozenset[str]] = {}

    async def known_valid(self, domain: str) -> frozenset[str]:
        """The account's valid addresses at ``domain`` in the verification history (read
        once per domain); empty when the history cannot be read."""
        valid = self._valid.get(domain)
        if valid is None:
            try:
                valid = await asyncio.to_thread(
                    valid_locals, self.data_dir, self.account_id, domain
                )
            except (duckdb.Error, OSError) as exc:
                log.warning("verification history of %s not read: %s", domain, exc)
                valid = frozenset()
            self._valid[domain] = valid
        return valid

    async def load(self, domain: str) -> DomainPattern:
        known = self._known.get(domain)
        if known is None:
            scope = None if self.shared else self.account_id
            try:
                counts = await db_retried(
                    pattern_store.pattern_counts, self.store.engine, domain, scope
                )
            except SQLAlchemyError as exc:
                log.warning("learned patterns of %s not read: %s", domain, exc)
                counts = {}
            known = self._known[domain] = DomainPattern(domain, counts)
        return known

    async def record(self, domain: str, pattern: str) -> None:
        self._known[domain] = (await self.load(domain)).with_find(pattern)
        try:
            await db_retried(
                pattern_store.record_find, self.store.engine, self.account_id, domain, pattern
            )
        except SQLAlchemyError as exc:
            log.warning("pattern %s of %s not recorded: %s", pattern, domain, exc)
