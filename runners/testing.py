"""A Prefect server, Prefect worker processes (and verimail's warm worker) for tests and
benchmarks (here so the suite and ``bench/`` share one recipe, as ``store/testing.py`` does
for throw-away databases).

A worker is ``prefect worker start --pool …`` from this interpreter's environment, on the
Prefect server this process uses (``PREFECT_API_URL``), polling every second; whatever is
left of it (the flow-run processes it started included) is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from verimail.store.testing import created_then_dropped, postgres_problem, postgres_test_url

PREFECT = str(Path(sys.executable).parent / "prefect")
VERIMAIL = str(Path(sys.executable).parent / "verimail")
PREFECT_START_SECONDS = 300  # (~15 s on a quiet machine; beside busy loops, many times that)
DRAIN_SECONDS = 10.0


@contextlib.contextmanager
def prefect_server() -> Iterator[None]:
    """A Prefect server for this process (its ``PREFECT_API_URL`` from here on), on a
    PostgreSQL database of its own where PostgreSQL will do, on SQLite (Prefect's test
    harness) otherwise; stopped, and its database dropped, at the end.

    Why not Prefect's harness alone: its server keeps its state in SQLite, and under
    concurrent runs a write now and then waited on SQLite's lock until it failed ("database
    is locked", a 503). Prefect's client retries such a request five times, 2 + 4 + 8 + 16 +
    32 s apart: a flow test that takes 1 s alone took 67 s in the suite, and the benchmarks
    saw the same 62-66 s stalls. PostgreSQL is the database Prefect recommends for
    concurrent use. What the harness does besides (the server registered as the process's
    default, the settings made global for threads that do not inherit the context, the logs
    drained before the stop) is done the same way."""
    base = postgres_test_url()
    if not _postgres_will_do(base):
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=PREFECT_START_SECONDS):
            yield
        return
    with prefect_database(base) as url, _server_on(url):
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


@contextlib.contextmanager
def prefect_database(base: str) -> Iterator[str]:
    """An empty database for a Prefect server on the PostgreSQL of ``base`` (a database, not
    a schema: Prefect's migrations create an extension), as an asyncpg URL; dropped
    afterwards."""
    name = f"prefect_test_{secrets.token_hex(6)}"
    url = make_url(base).set(drivername="postgresql+asyncpg", database=name)
    with created_then_dropped(
        base, f'CREATE DATABASE "{name}"', f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    ):
        yield url.render_as_string(hide_password=False)


@contextlib.contextmanager
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

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: database_url})
        )
        server = SubprocessASGIServer(port=free_port())
        # As Prefect's harness: code that asks for "the" embedded server finds this one
        # instead of starting a second, unowned server.
        prior = SubprocessASGIServer._instances.get(None)
        SubprocessASGIServer._instances[None] = server
        try:
            server.start(timeout=PREFECT_START_SECONDS)
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (for the suite's and the
    benchmarks' servers)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def worker_env(
    base: Mapping[str, str], *, database_url: str, data_dir: Path, **extra: str
) -> dict[str, str]:
    """A worker's environment: this process's without any ``VERIMAIL_*`` setting, then
    ``base`` (the testbed's settings, say), the shared store and results directory, this
    process's Prefect server, and ``extra``."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIMAIL_")}
    env.update(
        {
            **base,
            "VERIMAIL_DATABASE_URL": database_url,
            "VERIMAIL_DATA_DIR": str(data_dir),
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


@contextlib.contextmanager
def prefect_worker(
    pool: str, env: Mapping[str, str], log: Path, *, limit: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``prefect worker`` process on ``pool`` (at most ``limit`` flow runs at once), its
    output appended to ``log`` (whose folder is its working directory); whatever is left of
    it is killed at the end."""
    command = [PREFECT, "worker", "start", "--pool", pool]
    if limit is not None:
        command += ["--limit", str(limit)]
    with log.open("ab") as out:
        worker = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
    try:
        yield worker
    finally:
        kill_tree(worker.pid)
        worker.wait(timeout=30)


@contextlib.contextmanager
def warm_worker(
    pool: str | None,
    env: Mapping[str, str],
    log: Path,
    *,
    limit: int | None = 2,
    poll: float | None = 0.2,
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``verimail worker`` process (the warm worker) on ``pool``, as :func:`prefect_worker`
    starts Prefect's; whatever is left of it is killed at the end (a test that wants to see
    it stop on SIGTERM sends it and waits first). ``None`` leaves an option out: with all
    three None it is the command as docs/deployment.md writes it (``verimail worker``; the
    pool from ``VERIMAIL_PREFECT_WORK_POOL``)."""
    command = [VERIMAIL, "worker"]
    for option, value in (("--pool", pool), ("--limit", limit), ("--poll", poll)):
        if value is not None:
            command += [option, f"{value:g}" if isinstance(value, float) else str(value)]
    with log.open("ab") as out:
        worker = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
    try:
        yield worker
    finally:
        kill_tree(worker.pid)
        worker.wait(timeout=30)


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc: the flow-run processes a worker starts are
    in sessions of their own, so killing the worker's process group would miss them)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it, at once (as when its machine goes away)."""
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)
