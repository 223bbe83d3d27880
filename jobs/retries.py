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

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from verimail.config import Settings
from verimail.engine import Routes
from verimail.store import jobs as job_store
from verimail.store.db import utcnow

RETRYABLE = (
    "greylisted",
    "temp_failure",
    "timeout",
    "connection_failed",
    "egress_failed",
    "egress_blocked",
)
"""Sub-statuses a later pass may settle (the server put us off, could not be reached, our
proxy failed, or the server refused our sending IP: by the pass the egress's cool-down may be
over, a blocklist entry gone, or another route configured; while it cools down the pass asks
nothing of it). A retried address goes out through the egress of its first try (recorded with
its parked row; ``engine/smtp/egress.py``), so a greylisted address is asked again from the
client address that was greylisted."""

STATE_FILE = "retry-state.parquet"


def enabled(settings: Settings, job: job_store.Job) -> bool:
    """Deferred retries apply: passes are configured and the job did not opt out."""
    return wanted(settings, (job.options or {}).get("retry_unknowns", True))


def wanted(settings: Settings, retry_unknowns: bool) -> bool:
    """Deferred retries apply to work whose owner chose ``retry_unknowns`` (a job's option,
    an operator run's parameter): passes are configured and it did not opt out."""
    return settings.job_retry_passes > 0 and retry_unknowns


def in_pass_greylist_retries(settings: Settings, *, deferred_pass_follows: bool) -> int:
    """How often a pass retries a greylisted recipient before it answers ``greylisted``.

    A pass that a deferred pass follows parks it at once by default
    (``job_greylist_retries`` 0): the deferred pass asks again anyway, and waiting inside
    the pass (5 + 10 + 20 s with the in-run back-off) only held the run's slot. The last
    pass — and work that opted out of deferred retries — keeps the in-run back-off
    (``smtp_greylist_retries``): it is the recipient's last chance."""
    if deferred_pass_follows:
        return settings.job_greylist_retries
    return settings.smtp_greylist_retries


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


def record_egresses(settings: Settings, results: pl.DataFrame) -> pl.DataFrame:
    """``results`` with an ``egress`` column: for each row a later pass will ask again, the
    egress its domain left through (the routes' choice by its MX hosts; a domain without MX
    records is its own mail host), so that pass asks from the same client address, even if
    the egress file changed meanwhile. Results without addresses' MX (a finder job's rows)
    are kept as they are."""
    if not {"domain", "mx_records", "sub_status"} <= set(results.columns):
        return results
    routes = Routes.from_settings(settings)
    put_off = pl.col("sub_status").is_in(RETRYABLE)
    domains = results.filter(put_off).unique("domain").select("domain", "mx_records")
    chosen = {
        domain: routes.choose(tuple(mx or ()) or (domain,), domain).name
        for domain, mx in domains.iter_rows()
        if domain
    }
    egress = pl.col("domain").replace_strict(chosen, default=None, return_dtype=pl.String)
    return results.with_columns(pl.when(put_off).then(egress).otherwise(None).alias("egress"))


def recorded_egresses(state: pl.DataFrame, again: list[str]) -> dict[str, str]:
    """Domain -> egress of the rows ``again`` will ask, as :func:`record_egresses` kept them."""
    if "egress" not in state.columns:
        return {}
    rows = state.filter(pl.col("normalised").is_in(again) & pl.col("egress").is_not_null())
    return dict(zip(rows["domain"].to_list(), rows["egress"].to_list(), strict=True))


def state_path(directory: Path) -> Path:
    return directory / STATE_FILE


def save_state(directory: Path, by_address: pl.DataFrame) -> None:
    """Keep the run's results beside the job (atomically) for the next pass."""
    write_atomically(by_address, state_path(directory))


def write_atomically(frame: pl.DataFrame, path: Path) -> None:
    """``frame`` to Parquet at ``path``, put in place whole: a reader (the next pass, or a
    cancellation in another thread) sees the old file or the new one, never half of one."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")  # (writers may race)
    try:
        frame.write_parquet(partial)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
