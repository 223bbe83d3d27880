"""Helpers shared by the ``test_hardening_*`` files and the flows' recovery tests: sizes
that CI keeps small, lazy bodies, the environment of a ``verimail serve`` subprocess, the
ledger invariant, and recovery's claim on a job it takes for dead. (Polling a job is
``api_helpers.poll_job``.)"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from api_helpers import env_for_testbed

from verimail.store import jobs as job_store
from verimail.store.billing.ledger import LedgerEntry, ledger
from verimail.store.billing.pools import balance
from verimail.store.db import Store
from verimail.store.job_retries import claim_for_resume
from verimail.testbed.server import Testbed

SCALE_ENV = "VERIMAIL_HARDENING_SCALE"


def scaled(n: int) -> int:
    """``n`` times ``$VERIMAIL_HARDENING_SCALE`` (default 1): the ``slow`` tests run at a
    small size in CI and at any size by hand, e.g. ``VERIMAIL_HARDENING_SCALE=50``."""
    return n * max(1, int(os.environ.get(SCALE_ENV, "1")))


class LazyBody:
    """An async byte stream of ``total`` bytes made on demand, that counts what was pulled.

    ``prefix`` is sent first, then ``filler`` repeated; nothing but the current chunk is
    ever in memory, so a "1 GB upload" costs nothing unless the server reads it all.
    """

    def __init__(
        self, total: int, prefix: bytes = b"", filler: bytes = b"x", chunk: int = 64 * 1024
    ) -> None:
        self.total = total
        self.prefix = prefix
        self.block = (filler * (chunk // len(filler) + 1))[:chunk]
        self.sent = 0
        self.exhausted = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.prefix:
            self.sent += len(self.prefix)
            yield self.prefix
        while self.sent < self.total:
            piece = self.block[: self.total - self.sent]
            self.sent += len(piece)
            yield piece
        self.exhausted = True


def serve_env(tb: Testbed, url: str, data: Path, **extra: str) -> dict[str, str]:
    """What a ``verimail serve`` subprocess needs: the testbed, the store, the shared Prefect
    server of this test session (never an embedded one of its own). Call it while the
    session's ``prefect_harness`` is active."""
    import prefect.settings  # ~2 s: only the tests that start processes pay for it

    return {
        **env_for_testbed(tb),
        "VERIMAIL_DATABASE_URL": url,
        "VERIMAIL_DATA_DIR": str(data),
        "VERIMAIL_PREFECT_WARM_UP": "false",
        "PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        **extra,
    }


def assert_ledger_exact(store: Store, account_id: int) -> list[LedgerEntry]:
    """The prepaid ledger is one running balance: each row's ``balance_after`` is the last
    one plus its ``delta``, it never goes below zero, and it ends at the balance."""
    rows = sorted(ledger(store.engine, account_id, limit=100_000), key=lambda r: r.id)
    running = 0
    for row in rows:
        assert row.source == "prepaid", row  # enterprise: no allowance pool
        running += row.delta
        assert row.balance_after == running, (row, running)
        assert running >= 0, row
    assert balance(store.engine, account_id).prepaid == running
    return rows


def assert_no_open_jobs(store: Store) -> None:
    """No job is left ``pending`` or ``processing``, however recent its heartbeat."""
    assert job_store.find_stale_processing(store.engine, timedelta(0), include_pending=True) == []


def take_for_dead(store: Store, job_id: int) -> int | None:
    """Do what recovery does to a job it takes for dead: claim it for the next run, whose
    attempt number this returns. The claim races the live run's beats (it only holds when
    no beat moved meanwhile), so it is retried until it holds; None if it never does."""
    for _ in range(1000):
        job = job_store.get_job_any(store.engine, job_id)
        assert job is not None
        claimed = claim_for_resume(store.engine, job_id, job.heartbeat_at)
        if claimed is not None:
            return claimed
    return None
