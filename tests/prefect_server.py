"""The test session's Prefect server: Prefect's test harness, on a PostgreSQL database of
its own where PostgreSQL answers (on SQLite otherwise, as Prefect's harness has it).

Why not Prefect's harness as it is: its server keeps its state in SQLite, and under the
suite's concurrent runs a write now and then waited on SQLite's lock until it failed
("database is locked", a 503). Prefect's client retries such a request five times, 2 + 4 +
8 + 16 + 32 s apart: a flow test that takes 1 s alone took 67 s in the suite, and the
benchmarks saw the same 62–66 s stalls. PostgreSQL is the database Prefect recommends for
concurrent use. What the harness does besides (the server registered as the process's
default, the settings made global for threads that do not inherit the context, the logs
drained before the stop) is done the same way here.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from verimail.store.testing import postgres_problem, postgres_test_url

STARTUP_SECONDS = 90
DRAIN_SECONDS = 10.0


@contextmanager
def prefect_server() -> Iterator[None]:
    """Prefect's API for the tests of this process, stopped (and its database dropped) at
    the end."""
    base = postgres_test_url()
    if not _postgres_will_do(base):
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=STARTUP_SECONDS):
            yield
        return
    with _database(base) as url, _server_on(url):
        yield


def _postgres_will_do(base: str) -> bool:
    """PostgreSQL answers, lets us create a database, and has the extension Prefect's
    migrations create (``pg_trgm``, from PostgreSQL's contrib)."""
    if postgres_problem(base):
        return False
    engine = create_engine(base, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = "
                        "'pg_trgm') AND (SELECT rolcreatedb OR rolsuper FROM pg_roles "
                        "WHERE rolname = current_user)"
                    )
                ).scalar()
            )
    finally:
        engine.dispose()


@contextmanager
def _database(base: str) -> Iterator[str]:
    """An empty PostgreSQL database for Prefect (it needs a database, not a schema: its
    migrations create an extension), as an asyncpg URL; dropped afterwards."""
    name = f"prefect_test_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(base).set(drivername="postgresql+asyncpg", database=name)
        try:
            yield url.render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextmanager
def _server_on(database_url: str) -> Iterator[None]:
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )

    with ExitStack() as stack:
        stack.enter_context(
            temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: database_url})
        )
        server = SubprocessASGIServer(port=_free_port())
        # As Prefect's harness: code that asks for "the" embedded server finds this one
        # instead of starting a second, unowned server.
        prior = SubprocessASGIServer._instances.get(None)
        SubprocessASGIServer._instances[None] = server
        try:
            server.start(timeout=STARTUP_SECONDS)
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
            # (threads that do not inherit this context read the global settings)
            stack.enter_context(
                prefect.context._temporary_global_settings_context(
                    prefect.context.get_settings_context()
                )
            )
            yield
            # The last log lines and events, sent before the server stops (left queued,
            # they are sent at exit to a stopped server, retried for a minute).
            APILogWorker.drain_all(timeout=DRAIN_SECONDS)
            EventsWorker.drain_all(timeout=DRAIN_SECONDS)
        finally:
            server.stop()
            if prior is not None:
                SubprocessASGIServer._instances[None] = prior
            else:
                SubprocessASGIServer._instances.pop(None, None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
