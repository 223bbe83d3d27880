"""Engines, transactions and start-up migrations for the store.

SQLite (the default, one file under the data dir) and PostgreSQL (several API processes and
workers) differ in how writers are serialised:

* SQLite: every writing transaction starts with ``BEGIN IMMEDIATE``, taking the database's
  single write lock up front. A plain ``BEGIN`` would read first and fail with
  ``SQLITE_BUSY`` when it later tries to upgrade to a write lock while another writer
  committed; ``IMMEDIATE`` makes writers queue (``busy_timeout``) instead of failing.
  WAL keeps readers from blocking on writers and vice versa.
* PostgreSQL: ordinary READ COMMITTED transactions; code that must serialise on an account
  locks its row (``SELECT … FOR NO KEY UPDATE``).

Use :func:`write_tx` for anything that writes and ``engine.connect()``/``engine.begin()``
for reads.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from verimail.config import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for the write lock before giving up (queue, don't fail)."""

_MIGRATING = threading.Lock()
"""One migration at a time in a process: alembic keeps the running one in module globals
(``alembic.op``, ``alembic.context``), and two at once (the API's start-up and a job
thread's first store) ran one database's steps on the other's connection."""

_SQLITE_BEGIN_OPTION = "verimail_sqlite_begin"


def utcnow() -> datetime:
    """The current time, aware and in UTC (the store never handles naive datetimes)."""
    return datetime.now(UTC)


def is_sqlite(engine_or_conn: Engine | Connection) -> bool:
    """True on SQLite, where ``BEGIN IMMEDIATE`` replaces row locks."""
    return engine_or_conn.dialect.name == "sqlite"


def make_engine(settings: Settings, url: str | None = None) -> Engine:
    """A sync engine for ``url`` (default ``settings.database_url``), tuned per backend.

    A bare ``postgresql://`` URL is given the installed psycopg 3 driver (SQLAlchemy would
    otherwise pick psycopg2, which is not a dependency). The SQLite file's directory is
    created, so a fresh data dir just works.
    """
    sa_url = make_url(url or settings.database_url or "")
    if sa_url.drivername in ("postgresql", "postgres"):
        sa_url = sa_url.set(drivername="postgresql+psycopg")

    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, pool_pre_ping=True)

    database = sa_url.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    kwargs: dict[str, Any] = {
        "connect_args": {
            "check_same_thread": False,
            "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
        }
    }
    if in_memory:
        # One shared connection, or every pool connection would see its own empty database.
        kwargs["poolclass"] = StaticPool
    else:
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(sa_url, **kwargs)
    _configure_sqlite(engine, wal=not in_memory)
    return engine


def _configure_sqlite(engine: Engine, *, wal: bool) -> None:
    """Take transaction control away from pysqlite so ``BEGIN IMMEDIATE`` is possible.

    Python 3.11's sqlite3 issues its own ``BEGIN`` lazily before DML (and never before
    SELECT); with ``isolation_level = None`` it stays out of the way and SQLAlchemy's
    ``begin`` event emits the ``BEGIN`` we choose (the recipe in SQLAlchemy's SQLite docs).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL is durable across application crashes (not power loss of the
                # last commits) and much faster than FULL; fine for this state.
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN_OPTION, "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """A transaction meant to write: committed on success, rolled back on error.

    On SQLite it begins with ``BEGIN IMMEDIATE`` (see the module docstring); on PostgreSQL
    it is a plain transaction and callers lock the rows they must serialise on.
    """
    with engine.connect() as conn:
        if is_sqlite(conn):
            conn.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn


def _alembic_config(connection: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest migration; a no-op when it is already there.

    Runs in one writing transaction: on SQLite ``BEGIN IMMEDIATE`` serialises concurrent
    start-ups; on PostgreSQL a transaction-scoped advisory lock (per schema) does, so two
    API processes starting at once never both try to create the tables. PostgreSQL DDL is
    transactional, so a failed migration leaves nothing half-done.
    """
    with _MIGRATING, write_tx(engine) as conn:
        if conn.dialect.name == "postgresql":
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            digest = hashlib.sha256(f"verimail-migrate:{schema}".encode()).digest()
            key = int.from_bytes(digest[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        command.upgrade(_alembic_config(conn), "head")


def current_revision(engine: Engine) -> str | None:
    """The migration revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@dataclass(frozen=True)
class Store:
    """A migrated engine plus the settings it was made from, handed to the API and flows."""

    engine: Engine
    settings: Settings

    def close(self) -> None:
        """Release pooled connections (tests and CLI commands call this when done)."""
        self.engine.dispose()


def init_store(settings: Settings, url: str | None = None) -> Store:
    """Make the engine and bring the schema up to date: what every process does at start-up."""
    engine = make_engine(settings, url)
    migrate(engine)
    return Store(engine=engine, settings=settings)
