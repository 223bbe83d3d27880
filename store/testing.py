"""Throw-away databases for tests (here so the API, flow and store tests share one recipe).

Each call gets its own database — a SQLite file in the given directory, or a fresh schema
``t_<random>`` on PostgreSQL selected through ``search_path`` in the URL — so test runs of
several engineers on one PostgreSQL server never see each other's tables. When PostgreSQL
does not answer, :class:`unittest.SkipTest` is raised, which pytest reports as a skip.
"""

from __future__ import annotations

import os
import secrets
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from verimail.config import Settings
from verimail.store.db import Store, init_store

POSTGRES_URL_ENV = "VERIMAIL_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

Backend = Literal["sqlite", "postgres"]


def postgres_test_url() -> str:
    """The PostgreSQL server tests use (``VERIMAIL_TEST_POSTGRES_URL`` overrides)."""
    return os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL


@cache
def postgres_problem(url: str) -> str | None:
    """Why PostgreSQL at ``url`` is unusable, or None; asked once per process."""
    engine = create_engine(url, connect_args={"connect_timeout": 3}, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "skip", with the reason shown
        return f"PostgreSQL at {make_url(url).render_as_string()} did not answer: {exc}"
    finally:
        engine.dispose()
    return None


@contextmanager
def temporary_database_url(backend: Backend, directory: Path) -> Iterator[str]:
    """A SQLAlchemy URL of an empty database of ``backend``, dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'verimail-test.db'}"
        return
    base = postgres_test_url()
    problem = postgres_problem(base)
    if problem:
        raise unittest.SkipTest(problem)
    schema = f"t_{secrets.token_hex(6)}"
    url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    with created_then_dropped(
        base, f'CREATE SCHEMA "{schema}"', f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'
    ):
        yield url.render_as_string(hide_password=False)


@contextmanager
def created_then_dropped(base: str, create: str, drop: str) -> Iterator[None]:
    """``create`` run on the PostgreSQL server of ``base`` now, ``drop`` at the end (outside
    a transaction: ``CREATE DATABASE`` cannot run in one)."""
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(create))
        try:
            yield
        finally:
            with admin.connect() as conn:
                conn.execute(text(drop))
    finally:
        admin.dispose()


@contextmanager
def temporary_store(backend: Backend, directory: Path, **settings: Any) -> Iterator[Store]:
    """A migrated :class:`Store` on a throw-away database; ``settings`` override defaults."""
    with temporary_database_url(backend, directory) as url:
        config = Settings(data_dir=directory / "data", database_url=url, **settings)
        store = init_store(config)
        try:
            yield store
        finally:
            store.close()
