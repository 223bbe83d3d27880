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
            assert current_revision(first.engine) == "0006"
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
            assert [v[0] for v in versions] == ["0006"]
        finally:
            first.close()
            second.close()


def test_two_databases_migrated_at_once_in_one_process(tmp_path: Path) -> None:
    """Alembic keeps the running migration in module globals (``alembic.op``): two at once
    in one process (the API's start-up and a job thread's first store, two apps of the
    suite) cleared each other's, and one failed with "'NoneType' object has no attribute
    'create_table'"."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    together = threading.Barrier(4)

    def start(i: int) -> str | None:
        settings = Settings(
            data_dir=tmp_path / f"d{i}", database_url=f"sqlite:///{tmp_path}/db{i}.sqlite"
        )
        together.wait()
        store = init_store(settings)
        try:
            return current_revision(store.engine)
        finally:
            store.close()

    with ThreadPoolExecutor(4) as pool:
        revisions = list(pool.map(start, range(4)))
    assert revisions == ["0006"] * 4


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
