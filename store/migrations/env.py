"""Alembic environment: migrations run on the connection :func:`verimail.store.db.migrate` passes.

There is no ``alembic.ini``: start-up migrates programmatically. Run by hand (e.g. to write
a new revision), this falls back to the configured ``VERIMAIL_DATABASE_URL``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from verimail.store.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables for later migrations.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from verimail.config import get_settings
    from verimail.store.db import make_engine

    engine = make_engine(get_settings())
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
_main()
