"""What a job's results say beyond each row: a re-verification's changes against the run it
is compared with, and the rows whose server refused our sending IP, by egress. Pure frame
functions, apart from ``bulk_io`` (which writes the files) so each stays one responsibility."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from verimail.schemas.outcomes import egress_in_reason

# A re-verification's download adds these after ``Safe to Send``: the row's status in the
# run it was compared with, and whether it changed (``Yes``/``No``; empty without an address).
PREVIOUS_COLUMN = "previous_status"
CHANGED_COLUMN = "status_changed"


def with_previous_status(frame: pl.DataFrame, previous: Path) -> pl.DataFrame:
    """``frame`` (one row per data row) with ``previous_status``: the status its address had
    in the results at ``previous`` (null for a row without an address or one not there)."""
    before = (
        pl.read_parquet(previous, columns=["normalised", "status"])
        .drop_nulls("normalised")
        .unique("normalised", keep="first", maintain_order=True)
        .rename({"status": PREVIOUS_COLUMN})
    )
    return frame.join(before, on="normalised", how="left", maintain_order="left")


def count_transitions(frame: pl.DataFrame) -> dict[str, int]:
    """Rows whose status differs from their previous one, by ``"<previous>-><status>"``
    (rows, like the job's counts: an address on two rows counts twice)."""
    changed = frame.filter(
        pl.col("status").is_not_null()
        & pl.col(PREVIOUS_COLUMN).is_not_null()
        & (pl.col("status") != pl.col(PREVIOUS_COLUMN))
    )
    keys = (changed.get_column(PREVIOUS_COLUMN) + "->" + changed.get_column("status")).to_list()
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def count_egress_blocked(frame: pl.DataFrame) -> dict[str, int]:
    """Rows whose server refused our sending IP (``egress_blocked``), by the egress their
    reason names (rows, like the job's counts)."""
    blocked = frame.filter(pl.col("sub_status") == "egress_blocked").get_column("reason")
    counts: dict[str, int] = {}
    for reason in blocked.to_list():
        egress = egress_in_reason(reason) or "unnamed"
        counts[egress] = counts.get(egress, 0) + 1
    return counts


def change_columns(frame: pl.DataFrame) -> dict[str, list[str]]:
    """A re-verification's ``previous_status`` and ``status_changed`` cells, in row order;
    nothing for a frame without previous statuses (a first run)."""
    if PREVIOUS_COLUMN not in frame.columns:
        return {}
    previous = frame.get_column(PREVIOUS_COLUMN).to_list()
    status = frame.get_column("status").to_list()
    changed = [
        "" if now is None or before is None else ("Yes" if now != before else "No")
        for before, now in zip(previous, status, strict=True)
    ]
    return {PREVIOUS_COLUMN: [v or "" for v in previous], CHANGED_COLUMN: changed}
