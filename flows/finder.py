"""The ``find-emails`` flow: an Email Finder CSV job.

Read like a table of contents: read the upload, look its people up (the ``find-domains``
task of ``tasks/finder.py``: rows grouped by domain, one shared SMTP session per domain,
each find teaching the domain's pattern), then write the results — or, when mail servers
put some lookups off (greylisting, a temporary failure, a timeout, a refused connection),
park the job and look those rows up again in a later pass (``jobs/retries.py``), as a bulk
job does. Here is what the task is handed: the billing (``jobs/finder_billing.py``) and the
progress, which go to the store.

Billing as the job goes: each verified find is charged ``finder_charge`` on its own
(atomically). When a find cannot be paid for, the row is ``skipped_no_credits`` (its
address is not revealed) and so is every row not yet looked up; nothing else is charged.
Each charge is filed under its row (``job:<id>:row:<n>``) and made at most once: a run
that resumes the job after its runner died looks every row up again, but pays nothing for
the rows an earlier run paid for; a retry pass looks up only the rows put off, which were
not found, so not charged, before.

Stopped by its owner (Ctrl-C in ``verimail find --file``, whose main thread cancels the job
while this run goes on in another thread): the run saves its row outcomes beside the job
each time it writes its progress, and the cancellation hands over those rows in a partial
CSV, charging their finds and giving back any other (``jobs/cancel.py``).

Results CSV (written once, when the last pass ends): the upload byte for byte plus
``email``, ``status``, ``confidence`` (all three prefixed ``finder_`` when the upload
already has a column of one of those names). Row statuses: ``found``, ``not_found``,
``catch_all``, ``invalid_input`` (empty name or unusable domain), ``skipped_no_credits``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
from prefect import flow, get_run_logger
from pydantic.json_schema import SkipJsonSchema

from verimail.config import Settings, current_settings
from verimail.files.bulk_io import StagedFiles, job_dir, save_info
from verimail.files.csv_io import read_finder_upload, write_finder_results
from verimail.flows.job_run import next_pass, park_or_finish, run_as_owner, start_job
from verimail.flows.planner import hand_over
from verimail.flows.summary import name_unnamed_run
from verimail.jobs import retries
from verimail.jobs.cancel import drop_finder_rows, save_finder_rows
from verimail.jobs.context import db_retried, store_for
from verimail.jobs.create import stored_info
from verimail.jobs.finder_billing import FinderBilling
from verimail.jobs.heartbeat import complete_run, still_owned
from verimail.jobs.learned_patterns import StoredPatterns
from verimail.store import jobs as job_store
from verimail.store.billing import quote
from verimail.store.db import Store
from verimail.tasks.finder import find_domains, task_shares

PROGRESS_SECONDS = 1.0  # at most one progress write per this many seconds, while rows finish
ROWS_SAVE_SHARE = 0.05
"""Of the run's time, at most this share goes to saving its rows for a cancellation while
rows finish (a full rewrite, off the event loop: ~0.15 s for 100,000 rows, so then every
3 s or so; a save is skipped, never put off: the next progress write saves the rows)."""

log = logging.getLogger(__name__)

# Where each row status is counted on the job row (finder jobs reuse the count columns).
STATUS_COLUMN = {
    "found": "found_count",
    "catch_all": "catch_all_count",
    "not_found": "invalid_count",
    "invalid_input": "risky_count",
    "skipped_no_credits": "unknown_count",
}


STATE_COLUMNS = ("email", "status", "confidence", "sub_status")
"""A row's outcome as a pass leaves it (``retry-state.parquet``, beside ``row``)."""
RowOutcome = tuple[str, str, str, str | None]
"""(email, status, confidence, sub-status of a lookup the server put off)"""


class _Progress:
    """Row outcomes as they come, flushed to the job row now and then, and saved in the
    job's folder for its owner's Ctrl-C (``jobs/cancel.py``)."""

    def __init__(
        self, store: Store, job: job_store.Job, billing: FinderBilling, directory: Path
    ) -> None:
        self.store = store
        self.job = job
        self.billing = billing
        self.directory = directory
        self.rows: dict[int, RowOutcome] = {}
        self.counts: Counter[str] = Counter()
        self._flushed_at = -math.inf  # monotonic
        self._flushing = False
        self._changed = False  # rows recorded since they were last saved
        self._saved_at = -math.inf  # monotonic
        self._save_cost = 0.0  # seconds the last save took
        self._saving = asyncio.Lock()  # (saves in order: an older one never lands last)

    def record(
        self,
        row: int,
        email: str | None,
        status: str,
        confidence: float,
        unchecked: str | None = None,
    ) -> None:
        self._keep(row, email or "", status, f"{confidence:.2f}", unchecked)

    def _keep(self, row: int, email: str, status: str, confidence: str, sub: str | None) -> None:
        self.rows[row] = (email, status, confidence, sub)
        self.counts[STATUS_COLUMN[status]] += 1
        self._changed = True

    def frame(self) -> pl.DataFrame:
        """Every row's outcome so far: what a pass leaves for the next one."""
        return _frame(self.rows)

    def restore(self, earlier: pl.DataFrame) -> None:
        """The outcomes of rows an earlier pass settled (a retry pass asks only the rest)."""
        for row, *cells in earlier.select("row", *STATE_COLUMNS).iter_rows():
            self._keep(row, *cells)

    async def tick(self) -> None:
        """Flush when the last flush is :data:`PROGRESS_SECONDS` old: a poll shows rows
        and credits as they go, not only when a task's 50 domains are done."""
        if self._flushing or time.monotonic() - self._flushed_at < PROGRESS_SECONDS:
            return
        self._flushing = True
        try:
            await self.flush(ticked=True)
        finally:
            self._flushing = False

    async def flush(self, *, ticked: bool = False) -> None:
        """Write the progress, after the rows it counts are saved (a Ctrl-C that sees N
        rows done finds them); ``ticked``: rows are still finishing, so the rows are saved
        only if that keeps to :data:`ROWS_SAVE_SHARE` of the time."""
        self._flushed_at = time.monotonic()
        await self._save_rows(ticked)
        await db_retried(
            job_store.update_progress,
            self.store.engine,
            self.job.id,
            len(self.rows),
            dict(self.counts),
            credits_used=self.billing.used,
            attempt=self.job.attempt,
        )

    async def _save_rows(self, ticked: bool) -> None:
        async with self._saving:
            if not self._changed:
                return
            pause = max(PROGRESS_SECONDS, self._save_cost / ROWS_SAVE_SHARE)
            if ticked and time.monotonic() - self._saved_at < pause:
                return
            started = time.monotonic()
            self._changed = False
            rows = dict(self.rows)  # (a copy, ~6 ms for 100,000 rows: they go on changing)
            try:
                await asyncio.to_thread(_save, self.directory, self.job.attempt, rows)
            except OSError as exc:  # (for a Ctrl-C only: never the job's failure)
                log.warning("finder job %s: rows not saved (%s)", self.job.id, exc)
                self._changed = True
            self._saved_at = time.monotonic()
            self._save_cost = self._saved_at - started


def _frame(rows: dict[int, RowOutcome]) -> pl.DataFrame:
    return pl.DataFrame(
        [(row, *rows[row]) for row in sorted(rows)],
        schema={"row": pl.Int64, **dict.fromkeys(STATE_COLUMNS, pl.String)},
        orient="row",
    )


def _save(directory: Path, attempt: int, rows: dict[int, RowOutcome]) -> None:
    """(In a worker thread: ~0.15 s for 100,000 rows, mostly building the frame.)"""
    save_finder_rows(directory, attempt, _frame(rows))


@flow(name="find-emails", persist_result=False, log_prints=True)
async def find_emails(
    job_id: int,
    attempt: SkipJsonSchema[int | None] = None,
    retry_pass: SkipJsonSchema[int] = 0,
) -> dict[str, Any]:
    """Run an Email Finder CSV job (created by ``POST /api/find-email/csv``) as run
    ``attempt`` (the number it was submitted as); ``retry_pass``: its deferred pass of
    that number, for the rows an earlier pass parked.

    Args:
        job_id: The finder job to run: its number (the `job_id` of the dashboard's job page
            or of POST /api/find-email/csv). A job that is running or has ended is left
            alone; an interrupted one is resumed.
    """
    settings = current_settings()
    store = store_for(settings)
    started = await start_job(store, job_id, attempt, retry_pass=retry_pass)
    if not isinstance(started, job_store.Job):
        return started
    job = started
    billing = FinderBilling(store, job, quote("find", 1, settings))
    directory = job_dir(settings.data_dir, job.id)
    directory.mkdir(parents=True, exist_ok=True)
    progress = _Progress(store, job, billing, directory)

    async def work() -> dict[str, Any]:
        await billing.load()
        return await _run(settings, store, job, billing, progress, retry_pass)

    # (finds are charged as they go: a failure refunds nothing; the progress is saved first)
    outcome = await run_as_owner(
        settings, store, job, work(), unverified=0, before_failing=progress.flush
    )
    return await hand_over(settings, outcome)


async def _run(
    settings: Settings,
    store: Store,
    job: job_store.Job,
    billing: FinderBilling,
    progress: _Progress,
    retry_pass: int,
) -> dict[str, Any]:
    """One pass: every row (the first), or the rows an earlier pass parked (``retry_pass``);
    then park the job again or finish it."""
    logger = get_run_logger()
    # (Here, under the job's heartbeat: a slow Prefect API must not make the job look dead.)
    await name_unnamed_run(job)
    upload = Path(job.upload_path or "")
    info, rows = await asyncio.to_thread(
        read_finder_upload,
        upload,
        job.options or {},
        settings.upload_max_rows,
        stored_info(settings, job),
    )
    directory = job_dir(settings.data_dir, job.id)
    directory.mkdir(parents=True, exist_ok=True)
    people = list(rows.iter_rows(named=True))
    if retry_pass:
        earlier = await asyncio.to_thread(pl.read_parquet, retries.state_path(directory))
        again = set(retries.parked(earlier, "row"))
        progress.restore(earlier.filter(~pl.col("row").is_in(again)))
        people = [person for person in people if person["row"] in again]
    shares = task_shares(people)
    logger.info(
        "finder job %s: %s rows, %s to look up in %s tasks (pass %s)",
        job.id,
        rows.height,
        len(people),
        len(shares),
        retry_pass,
    )
    patterns = StoredPatterns(store, job.account_id, settings)
    # A pass a retry follows asks a greylisting server every candidate, so the retry passes.
    open_greylist = next_pass(settings, job, retry_pass) is not None
    await asyncio.gather(
        *(
            find_domains(share, billing, progress, patterns, open_greylist=open_greylist)
            for share in shares
        )
    )
    await still_owned(store, job)
    waiting = await park_or_finish(
        settings,
        job,
        directory,
        progress.frame(),
        key="row",
        done_pass=retry_pass,
        processed=len(progress.rows),
        counts=dict(progress.counts),
    )
    if waiting is not None:
        return waiting
    files = StagedFiles.for_run(directory, job.attempt, ("results.csv",))
    try:
        await asyncio.to_thread(
            write_finder_results, upload, info, files.staged("results.csv"), progress.frame()
        )
        save_info(directory, info)
    except BaseException:
        files.discard()
        raise
    await complete_run(
        store, job, files, dict(progress.counts), billing.used, processed=rows.height
    )
    retries.state_path(directory).unlink(missing_ok=True)
    drop_finder_rows(directory)
    return {"job_id": job.id, "status": "completed", **progress.counts, "credits": billing.used}
