"""The verification history: Parquet files that DuckDB queries through views.

Every result of a bulk job or re-verification lands as a new Parquet file under
``<data_dir>/history/date=YYYY-MM-DD/``; nothing is ever rewritten, so any number of API
processes and workers can add to it at once (no single-writer database file). DuckDB
reads it on demand with three views:

- ``history`` — every verification (``email``, ``status``, ``verified_at``, ``job_id`` …);
- ``latest`` — the most recent verification of each address;
- ``changes`` — verifications whose status differs from the address's previous one
  (``previous_status``, ``previous_verified_at``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

_EMPTY = """
CREATE VIEW history AS SELECT
  NULL::VARCHAR AS email, NULL::VARCHAR AS status, NULL::VARCHAR AS sub_status,
  NULL::BOOLEAN AS safe_to_send, NULL::DOUBLE AS confidence_score, NULL::VARCHAR AS reason,
  NULL::VARCHAR AS domain, NULL::TIMESTAMPTZ AS verified_at, NULL::BIGINT AS job_id,
  NULL::BIGINT AS account_id, NULL::VARCHAR AS source
WHERE false
"""


def history_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "history"


def connect(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the ``history``, ``latest`` and ``changes`` views."""
    con = duckdb.connect(":memory:")
    # The files are listed here, not given to DuckDB as a pattern: a data dir whose path
    # holds "[" or "*" (/srv/verimail[prod]) would be a glob to DuckDB and match nothing.
    files = sorted(str(path) for path in history_dir(data_dir).glob("date=*/*.parquet"))
    if files:
        con.read_parquet(files, hive_partitioning=True, union_by_name=True).create_view(
            "history_files"
        )
        con.execute("CREATE VIEW history AS SELECT * EXCLUDE (date) FROM history_files")
    else:
        con.execute(_EMPTY)
    con.execute(
        """
        CREATE VIEW latest AS
        SELECT * EXCLUDE (rn) FROM (
          SELECT *, row_number() OVER (PARTITION BY email ORDER BY verified_at DESC) AS rn
          FROM history)
        WHERE rn = 1
        """
    )
    con.execute(
        """
        CREATE VIEW changes AS
        SELECT * FROM (
          SELECT *,
            lag(status) OVER w AS previous_status,
            lag(verified_at) OVER w AS previous_verified_at
          FROM history
          WINDOW w AS (PARTITION BY email ORDER BY verified_at))
        WHERE previous_status IS NOT NULL AND previous_status <> status
        """
    )
    return con


def _frame(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    """A query's result as a Polars frame, through Arrow (a relation: no extra row copy)."""
    frame = pl.from_arrow(con.sql(sql).to_arrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def query(data_dir: Path, sql: str) -> pl.DataFrame:
    """Run SQL over the views; the result as a Polars frame."""
    con = connect(data_dir)
    try:
        return _frame(con, sql)
    finally:
        con.close()


def query_rows(
    data_dir: Path, sql: str, limit: int, params: list[object] | None = None
) -> tuple[list[str], list[tuple], bool]:
    """(column names, the first ``limit`` rows as Python values, whether more follow): for
    printing any result, which a frame cannot always hold (two columns of one name, an
    ``INTERVAL``); a statement without a result gives no columns. ``params`` fill the
    ``?`` of ``sql`` (an address typed by a user is never pasted into SQL)."""
    con = connect(data_dir)
    try:
        relation = con.sql(sql, params=params)
        if relation is None:
            return [], [], False
        rows = relation.limit(limit + 1).fetchall()
        return list(relation.columns), rows[:limit], len(rows) > limit
    finally:
        con.close()


def latest_statuses(data_dir: Path, emails: list[str] | None = None) -> pl.DataFrame:
    """``email, status, verified_at`` of the latest verification (of ``emails`` if given)."""
    con = connect(data_dir)
    try:
        if emails is None:
            return _frame(con, "SELECT email, status, verified_at FROM latest")
        con.register("wanted", pl.DataFrame({"email": emails}).to_arrow())
        return _frame(
            con, "SELECT l.email, l.status, l.verified_at FROM latest l JOIN wanted USING (email)"
        )
    finally:
        con.close()


def valid_locals(data_dir: Path, account_id: int, domain: str) -> frozenset[str]:
    """Local parts of the addresses at ``domain`` whose latest verification by
    ``account_id`` was ``valid``: the Email Finder tries a person's candidate that is one of
    them first (the account's own history, whatever the pattern scope)."""
    con = connect(data_dir)
    try:
        rows = con.execute(
            """
            SELECT email, status FROM (
              SELECT email, status,
                row_number() OVER (PARTITION BY email ORDER BY verified_at DESC) AS rn
              FROM history WHERE account_id = ? AND domain = ?)
            WHERE rn = 1
            """,
            [account_id, domain],
        ).fetchall()
    finally:
        con.close()
    return frozenset(
        email.rpartition("@")[0].lower() for email, status in rows if status == "valid"
    )
