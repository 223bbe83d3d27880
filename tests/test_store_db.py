"""Engine set-up, migrations and plans of the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from verimail.config import Settings
from verimail.store.db import Store, current_revision, init_store, make_engine, migrate
from verimail.store.plans import PLANS, UnknownPlan, get_plan
from verimail.store.tables import metadata
from verimail.store.testing import temporary_database_url, temporary_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(backend, tmp_path) as s:  # type: ignore[arg-type]
        yield s


def test_migrations_create_every_table_and_are_idempotent(backend: str, tmp_path: Path) -> None:
    with temporary_database_url(backend, tmp_path) as url:  # type: ignore[arg-type]
        settings = Settings(data_dir=tmp_path, database_url=url)
        first = init_store(settings)
        second = init_store(settings)  # a second start-up: must be a no-op
        try:
            migrate(first.engine)
            assert current_revision(first.engine) == "0005"
            tables = set(inspect(first.engine).get_table_names())
            assert {
                "accounts",
                "api_keys",
                "credit_ledger",
                "jobs",
                "ended_sessions",
                "domain_patterns",
                "reverify_schedules",
                "reverify_runs",
                "job_shards",
                "alembic_version",
            } <= tables
            with first.engine.connect() as conn:
                versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            assert [v[0] for v in versions] == ["0005"]
        finally:
            first.close()
            second.close()


def test_migrated_schema_matches_tables_py(store: Store) -> None:
    """The hand-written migration and tables.py must not drift apart."""
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_sqlite_default_creates_data_dir_and_uses_wal(tmp_path: Path) -> None:
    data_dir = tmp_path / "not" / "yet" / "there"
    store = init_store(Settings(data_dir=data_dir, database_url=None))
    try:
        assert (data_dir / "verimail.db").exists()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        store.close()


def test_bare_postgresql_url_gets_psycopg_driver(tmp_path: Path) -> None:
    engine = make_engine(Settings(data_dir=tmp_path), "postgresql://u@localhost/db")
    assert engine.url.drivername == "postgresql+psycopg"
    engine.dispose()


def test_plans_follow_spec_section_8() -> None:
    free, starter, pro, business, enterprise = (PLANS[n] for n in PLANS)
    assert (free.requests_per_minute, free.allowance, free.period, free.concurrent) == (
        10,
        25,
        "day",
        1,
    )
    assert (starter.requests_per_minute, starter.allowance, starter.concurrent) == (60, 5000, 5)
    assert (pro.requests_per_minute, pro.allowance, pro.concurrent) == (120, 10000, 10)
    assert (business.requests_per_minute, business.allowance, business.concurrent) == (
        300,
        50000,
        25,
    )
    assert all(p.period == "month" for p in (starter, pro, business))
    assert (enterprise.requests_per_minute, enterprise.allowance, enterprise.concurrent) == (
        None,
        None,
        None,
    )
    assert get_plan("pro") is pro
    with pytest.raises(UnknownPlan):
        get_plan("gold")
