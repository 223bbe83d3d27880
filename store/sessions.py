"""Dashboard sessions ended by logging out.

A dashboard session lives in a signed cookie, so logging out could only replace the
browser's copy: a copy taken earlier (another browser, a stolen cookie) stayed signed in
until it expired. Logging out now records the session's id here — as a SHA-256, until the
cookie would have expired anyway — and a session whose id is recorded counts as logged out.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from verimail.store.db import utcnow, write_tx
from verimail.store.tables import ended_sessions


def _digest(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def end_session(engine: Engine, sid: str, until: datetime, *, now: datetime | None = None) -> None:
    """Record ``sid`` as logged out until ``until``; forget records past their expiry."""
    now = now or utcnow()
    digest = _digest(sid)
    with write_tx(engine) as conn:
        conn.execute(delete(ended_sessions).where(ended_sessions.c.expires_at <= now))
        # Two logouts of one session at once (a double click, two tabs) both insert: the
        # second must be a no-op, not a duplicate key (which PostgreSQL's row-level locking
        # let through a select-then-insert, as a 500).
        dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        conn.execute(
            dialect_insert(ended_sessions)
            .values(sid_hash=digest, expires_at=until)
            .on_conflict_do_nothing(index_elements=[ended_sessions.c.sid_hash])
        )


def session_ended(engine: Engine, sid: str) -> bool:
    """Whether ``sid`` was logged out (an expired record no longer matters: its cookie did
    expire too)."""
    with engine.connect() as conn:
        found = conn.execute(
            select(ended_sessions.c.sid_hash).where(ended_sessions.c.sid_hash == _digest(sid))
        ).first()
    return found is not None
