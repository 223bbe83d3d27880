"""Deferred retries of a job's unsettled addresses: which ones, when, and where they wait.

A job's first pass (bulk or finder) settles what it can. Addresses (a finder job: rows) the
servers put off — greylisting, other 4xx, timeouts, 421s, refused connections — are
*parked*: the run's results are saved beside the job, the job stays ``processing`` with
``phase`` ``waiting_to_retry``, and no worker is held. A later flow run (scheduled for
``next_retry_at``: a Prefect ``Scheduled`` run with workers, a timer in the local runner, or
the reaper's catch-up after a restart) claims the pass, asks those addresses again with the
same envelope sender, replaces their rows, and either parks again or finishes the job.
Credits were reserved once at creation and are settled once, when the last pass ends.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from verimail.config import Settings
from verimail.store import jobs as job_store
from verimail.store.db import utcnow

RETRYABLE = ("greylisted", "temp_failure", "timeout", "connection_failed", "egress_blocked")
"""Sub-statuses a later pass may settle (the server put us off, could not be reached, or
refused our sending IP: by the pass the egress's cool-down may be over, a blocklist entry
gone, or another route configured; while it cools down the pass asks nothing of it)."""

STATE_FILE = "retry-state.parquet"


def enabled(settings: Settings, job: job_store.Job) -> bool:
    """Deferred retries apply: passes are configured and the job did not opt out."""
    return wanted(settings, (job.options or {}).get("retry_unknowns", True))


def wanted(settings: Settings, retry_unknowns: bool) -> bool:
    """Deferred retries apply to work whose owner chose ``retry_unknowns`` (a job's option,
    an operator run's parameter): passes are configured and it did not opt out."""
    return settings.job_retry_passes > 0 and retry_unknowns


def parked(results: pl.DataFrame, key: str = "normalised") -> list[Any]:
    """The ``key`` (an address; a finder job's row) of results a later pass may settle."""
    return results.filter(pl.col("sub_status").is_in(RETRYABLE))[key].to_list()


def plan(
    settings: Settings, done_pass: int, waited: float, *, now: datetime | None = None
) -> tuple[int, datetime, float] | None:
    """The pass after ``done_pass`` (0: the first run): (its number, when it starts, delay
    planned in all), or None when the passes or the total wait are used up."""
    if done_pass >= settings.job_retry_passes:
        return None
    delay = settings.job_retry_delay * 2**done_pass
    if waited + delay > settings.job_retry_max_wait:
        return None
    return done_pass + 1, (now or utcnow()) + timedelta(seconds=delay), waited + delay


def state_path(directory: Path) -> Path:
    return directory / STATE_FILE


def save_state(directory: Path, by_address: pl.DataFrame) -> None:
    """Keep the run's results beside the job (atomically) for the next pass."""
    path = state_path(directory)
    partial = path.with_suffix(".partial")
    by_address.write_parquet(partial)
    partial.replace(path)
