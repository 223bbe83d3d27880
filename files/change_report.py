"""A re-verification's change report: the addresses whose status differs from the one the
history had for them, as a CSV (``email, previous_status, status, previous_verified_at,
reason``) that a later retry pass updates in place, and the transitions it counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from verimail.files.history import latest_statuses
from verimail.schemas.results import VerificationResult


def previous_statuses(
    data_dir: Path | str, addresses: list[str], results: list[VerificationResult]
) -> dict[str, tuple[str, datetime | None]]:
    """Each address's latest status and time in the history, before this run's are added.
    The history keys an address as its result spells it (an IDN domain in ASCII, say)."""
    before = latest_statuses(data_dir, [result.email for result in results])
    by_email = {
        row["email"]: (row["status"], row["verified_at"]) for row in before.iter_rows(named=True)
    }
    return {
        address: by_email[result.email]
        for address, result in zip(addresses, results, strict=True)
        if result.email in by_email
    }


def changes(
    addresses: list[str],
    results: list[VerificationResult],
    previous: Mapping[str, tuple[str, datetime | None]],
) -> list[dict[str, Any]]:
    """The report's rows: addresses whose status differs from their previous one."""
    changed = []
    for address, result in zip(addresses, results, strict=True):
        old = previous.get(address)
        if old is not None and old[0] != result.status.value:
            changed.append(
                {
                    "email": address,
                    "previous_status": old[0],
                    "status": result.status.value,
                    "previous_verified_at": old[1],
                    "reason": result.reason,
                }
            )
    return changed


REPORT_SCHEMA = {
    "email": pl.String,
    "previous_status": pl.String,
    "status": pl.String,
    "previous_verified_at": pl.Datetime(time_zone="UTC"),
    "reason": pl.String,
}


def write_report(path: Path, changed: list[dict[str, Any]]) -> None:
    partial = path.with_suffix(".partial")
    pl.DataFrame(changed, schema=REPORT_SCHEMA).write_csv(partial)
    partial.replace(path)  # (a reader never sees half a report)


def update_report(
    path: Path, addresses: list[str], fresh: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Replace the rows of ``addresses`` in the report with ``fresh``; its rows now."""
    kept = pl.read_csv(path, schema=REPORT_SCHEMA).filter(~pl.col("email").is_in(addresses))
    changed = kept.to_dicts() + fresh
    write_report(path, changed)
    return changed


def transitions(changed: list[dict[str, Any]]) -> Counter[str]:
    """The report's rows counted by ``"<previous>-><status>"``."""
    return Counter(f"{row['previous_status']}->{row['status']}" for row in changed)
