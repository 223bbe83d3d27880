"""Per-process handles the flows share: one migrated store and one engine per settings.

A flow run is one call in a long-lived process (the API with the local runner, or a
Prefect worker); building the store (migrations) and the engine (resolver, per-host
politeness semaphores) once per process keeps every run cheap and keeps the politeness
limits shared between concurrent runs.
"""

from __future__ import annotations

import threading

from verimail.config import Settings
from verimail.store.db import Store, init_store
from verimail.tasks.engine import Engine

_LOCK = threading.Lock()
_STORES: dict[str, Store] = {}
_ENGINES: dict[str, Engine] = {}


def store_for(settings: Settings) -> Store:
    """The migrated store of ``settings.database_url`` (made once per process)."""
    key = str(settings.database_url)
    with _LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = init_store(settings)
        return store


def engine_for(settings: Settings) -> Engine:
    """The verification engine for ``settings`` (made once per process)."""
    key = settings.model_dump_json()
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = Engine(settings)
        return engine


def forget(settings: Settings) -> None:
    """Drop the handles of ``settings`` (tests that dispose their database)."""
    with _LOCK:
        store = _STORES.pop(str(settings.database_url), None)
        engine = _ENGINES.pop(settings.model_dump_json(), None)
    if store is not None:
        store.close()
    if engine is not None:
        engine.close()
