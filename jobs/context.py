"""Per-process handles the flows share: one migrated store per database (the engine's
counterpart is ``engine.core.shared_engine``), and retried store calls.

A flow run is one call in a long-lived process (the API with the local runner, or a
Prefect worker); building the store (migrations) once per process keeps every run cheap.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from verimail.config import Settings
from verimail.engine import forget_engine
from verimail.store.db import Store, init_store
from verimail.store.jobs import get_job_any
from verimail.url_secrets import redact

log = logging.getLogger(__name__)

DB_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
"""Seconds between the tries of :func:`db_retried`: a run rides out ~7 s of database outage."""

_LOCK = threading.Lock()
_STORES: dict[str, Store] = {}


def store_for(settings: Settings) -> Store:
    """The migrated store of ``settings.database_url`` (made once per process)."""
    key = str(settings.database_url)
    with _LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = init_store(settings)
        return store


def forget(settings: Settings) -> None:
    """Drop the handles of ``settings`` (tests that dispose their database)."""
    with _LOCK:
        store = _STORES.pop(str(settings.database_url), None)
    if store is not None:
        store.close()
    forget_engine(settings)


async def db_retried(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking store call run off the event loop, and tried again while the database is
    briefly unreachable (a restart, a failover, a busy SQLite file): one such error during
    a progress write or a finder charge failed the whole job and threw its SMTP work away.
    Only for calls that are safe to repeat (progress, heartbeats, charges and refunds made
    once per reference)."""
    for delay in DB_RETRY_DELAYS:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            log.warning("database call %s failed (%s); trying again", fn.__name__, exc)
            await asyncio.sleep(delay)
    return await asyncio.to_thread(fn, *args, **kwargs)  # (the last try: its error stands)


def no_such_job(store: Store, job_id: int) -> ValueError:
    """The error of a run whose job is not in its database: name the database, because the
    usual cause is a worker without the API's ``VERIMAIL_DATABASE_URL``."""
    where = redact(store.engine.url.render_as_string(hide_password=False))
    return ValueError(
        f"no job {job_id} in {where}: every API process and worker must use the same "
        "VERIMAIL_DATABASE_URL"
    )


def attempt_of(settings: Settings, job_id: int) -> int | None:
    """The job's run number now, for a run submitted without one (None if it cannot be
    read: the run then reports the problem itself)."""
    try:
        job = get_job_any(store_for(settings).engine, job_id)
    except Exception:
        return None
    return job.attempt if job is not None else None
