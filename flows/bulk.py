"""The ``bulk-verify`` flow: a stored upload in, results CSV/Parquet and history out.

Reads as a table of contents of Prefect tasks: read the job's input (``read-job-input``),
verify it (the verify pipeline, ``tasks/pipeline.py``: ``prepare-addresses``, then a
``verify-host-groups`` task per chunk of mail-host groups, never per address), then either
park the job for a deferred pass over what the servers put off, or add the results to the
history (``record-history``), write its files (``write-results``) and complete it. Results
are written away batch by batch as they are known, and the job row and a Prefect progress
artifact show the progress.

The same flow serves CSV uploads (``POST /api/bulk``), JSON lists (``POST /api/verify/bulk``)
and runs started by hand from the Prefect UI with ``file_path`` and ``account_id`` (which
create their own job row through the job service, so the API sees them).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import polars as pl
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from pydantic.json_schema import SkipJsonSchema

from verimail.config import Settings, current_settings
from verimail.engine import EngineStats
from verimail.files.bulk_io import JobInput, ResultSink, job_dir, results_frame
from verimail.files.shards import merged_results, remove_shards
from verimail.flows.failures import refused
from verimail.flows.job_run import (
    park_or_finish,
    pass_greylist_retries,
    run_as_owner,
    start_job,
)
from verimail.flows.planner import from_deployment, hand_over, shard_request
from verimail.flows.shard import run_shard
from verimail.flows.summary import artifact_key, name_unnamed_run
from verimail.jobs import retries
from verimail.jobs.context import db_retried, store_for
from verimail.jobs.create import stored_info, stored_upload
from verimail.jobs.forms import FormError, create_job_for_file, create_job_for_form
from verimail.jobs.heartbeat import Superseded, complete_run, still_owned
from verimail.jobs.tally import Tally
from verimail.schemas.forms import BulkVerifyForm
from verimail.schemas.results import VerificationResult
from verimail.store import job_shards
from verimail.store import jobs as job_store
from verimail.store.billing import verify_job_credits
from verimail.store.db import Store
from verimail.tasks.job_files import read_input, record_history, write_results
from verimail.tasks.pipeline import verify_pass
from verimail.tasks.shards import plan_shards

ARTIFACT_TIMEOUT = 5.0
"""Seconds a progress artifact's Prefect API call may take. The artifact is only a view of
progress: a Prefect server slow to answer (its client waits up to 60 s) once held a job at
100% in processing for a minute, past a test's wait."""


@flow(name="bulk-verify", persist_result=False, log_prints=True)
async def bulk_verify(
    job_id: SkipJsonSchema[int | None] = None,
    file_path: SkipJsonSchema[str | None] = None,
    account_id: SkipJsonSchema[int | None] = None,
    email_column: SkipJsonSchema[str | None] = None,
    attempt: SkipJsonSchema[int | None] = None,
    verify: BulkVerifyForm | SkipJsonSchema[None] = None,
    retry_pass: SkipJsonSchema[int] = 0,
) -> Any:
    """Verify a CSV file for an account, or (the API's runs) a bulk job.

    Args:
        verify: The account, the file on the shared data dir, the email column, a webhook.
    """
    settings = current_settings()
    store = store_for(settings)
    if job_id is None:
        try:
            if verify is not None:
                job_id = await asyncio.to_thread(create_job_for_form, store, settings, verify)
            elif file_path is not None and account_id is not None:
                job_id = await asyncio.to_thread(
                    create_job_for_file, store, settings, file_path, account_id, email_column
                )
            else:
                raise FormError("Fill in the form: the account and the CSV file to verify.")
        except FormError as exc:
            return refused(str(exc))
    started = await start_job(store, job_id, attempt, retry_pass=retry_pass)
    if not isinstance(started, job_store.Job):
        return started
    job = started
    if verify is not None and job.webhook_url and job.status == "pending":
        secret = (job.options or {}).get("webhook_secret")
        get_run_logger().info("job %s: its webhook signing key is %s", job.id, secret)
    work = (
        _retry_pass(settings, store, job, retry_pass)
        if retry_pass
        else _first_pass(settings, store, job)
    )
    outcome = await run_as_owner(settings, store, job, work, unverified=job_store.UNVERIFIED)
    return await hand_over(settings, outcome)


async def _first_pass(settings: Settings, store: Store, job: job_store.Job) -> dict[str, Any]:
    """Every address of the upload, results written away batch by batch as they are known;
    then park the job for a deferred pass or finish it."""
    # (Here, under the job's heartbeat: a slow Prefect API must not make the job look dead.)
    await name_unnamed_run(job)
    job_input = await _read_input(settings, job)
    get_run_logger().info(
        "job %s: %s address rows, %s unique", job.id, job_input.address_rows, len(job_input.uniques)
    )
    if sharded(settings, job, len(job_input.uniques)):
        return await _sharded_pass(settings, store, job, job_input)
    tally = Tally(job_input.row_counts())
    sink = ResultSink(job_dir(settings.data_dir, job.id), run=job.attempt)
    progress = _Progress(settings, store, job, tally, job_input.address_rows)
    stats = EngineStats()
    async for settled in verify_pass(
        job_input.uniques,
        what=f"job {job.id}",
        stats=stats,
        greylist_retries=pass_greylist_retries(settings, job, 0),
    ):
        tally.add(settled)
        sink.add(settled)
        del settled  # (written away: not held while the progress is written)
        await progress.show()
    by_address = await asyncio.to_thread(sink.frame)
    summary = await _end_pass(
        settings, store, job, job_input, by_address, tally, done_pass=0, sink=sink
    )
    return {**summary, **stats.as_dict()} if summary["status"] == "completed" else summary


def sharded(settings: Settings, job: job_store.Job, unique_addresses: int) -> bool:
    """Whether the job's first pass is spread over shards: it has more distinct addresses
    than ``job_shard_size``, or an earlier run of it made its shards already."""
    limit = settings.job_shard_size
    return "shards" in (job.options or {}) or 0 < limit < unique_addresses


async def _sharded_pass(
    settings: Settings, store: Store, job: job_store.Job, job_input: JobInput
) -> dict[str, Any]:
    """A big job's first pass: its shards made (once), then run — each a ``verify-shard``
    run in the work pool, this run ending at once so that it holds no worker (the run that
    finishes the last shard starts this flow again to merge), or, with the local runner,
    all at once inside this run — and, once every shard is done, their results merged into
    the job's."""
    directory = job_dir(settings.data_dir, job.id)
    shards = await asyncio.to_thread(job_shards.shards_of, store.engine, job.id)
    if not shards:
        sizes = await plan_shards(
            directory, job_input.uniques, job_input.row_counts(), settings.job_shard_size
        )
        made = await asyncio.to_thread(
            job_shards.create_shards, store.engine, job.id, job.attempt, sizes
        )
        if not made:
            raise Superseded(f"job {job.id}: run {job.attempt} lost it before its shards")
        shards = await asyncio.to_thread(job_shards.shards_of, store.engine, job.id)
        get_run_logger().info(
            "job %s: %s shards of at most %s addresses (%s)",
            job.id,
            len(shards),
            settings.job_shard_size,
            ", ".join(str(s.addresses) for s in shards),
        )
    todo = [s for s in shards if s.status != "done"]
    if todo and from_deployment():  # (each shard not handed out yet; the rest the reaper's)
        runs = [
            shard_request(settings, job, s.shard, s.attempt, len(shards))
            for s in todo
            if s.status == "pending" and s.flow_run_id is None
        ]
        return {"job_id": job.id, "status": "sharded", "shards": len(shards), "next_runs": runs}
    if todo:
        await asyncio.gather(*(_in_this_run(store, s) for s in todo))
        shards = await asyncio.to_thread(job_shards.shards_of, store.engine, job.id)
        if any(s.status != "done" for s in shards):  # (taken over by another process)
            return {"job_id": job.id, "status": "sharded", "shards": len(shards)}
    by_address = await _merge(directory, job, shards)
    tally = Tally(job_input.row_counts())
    tally.add_statuses(zip(by_address["normalised"], by_address["status"], strict=True))
    summary = await _end_pass(settings, store, job, job_input, by_address, tally, done_pass=0)
    await asyncio.to_thread(remove_shards, directory)
    return summary


async def _merge(
    directory: Path, job: job_store.Job, shards: list[job_shards.Shard]
) -> pl.DataFrame:
    """Every shard's results, one per address — or :class:`Superseded` when some are gone:
    another run of the job merged them first (a merge started twice: the job's own run and
    the run that finished its last shard) and removed the shards' files. Completing the job
    from what is left would give it no results."""
    try:
        merged = await asyncio.to_thread(merged_results, directory, len(shards))
    except FileNotFoundError:  # (removed while it was read)
        merged = None
    if merged is None or merged.height != sum(s.addresses for s in shards):
        raise Superseded(f"job {job.id}: its shards' results were merged by another run")
    return merged


async def _in_this_run(store: Store, shard: job_shards.Shard) -> None:
    """Run a shard as a part of this run (the local runner: not a subflow, see
    ``flows/shard.py``); a shard an earlier run of this process left running (it died) is
    given to this run first."""
    attempt = shard.attempt
    if shard.status == "running":
        taken = await asyncio.to_thread(job_shards.assign, store.engine, shard.job_id, shard.shard)
        if taken is None:
            return
        attempt = taken
    await run_shard(shard.job_id, shard.shard, attempt)


async def _retry_pass(
    settings: Settings, store: Store, job: job_store.Job, retry_pass: int
) -> dict[str, Any]:
    """Deferred pass ``retry_pass``: ask the parked addresses again, replace their rows,
    then park again or finish. Other addresses keep the results they had."""
    job_input = await _read_input(settings, job)
    state = retries.state_path(job_dir(settings.data_dir, job.id))
    earlier = await asyncio.to_thread(pl.read_parquet, state)
    again = retries.parked(earlier)
    fresh: dict[str, VerificationResult] = {}
    pinned = retries.recorded_egresses(earlier, again)  # (each from its first try's egress)
    async for settled in verify_pass(
        again,
        what=f"job {job.id}, retry pass {retry_pass}",
        greylist_retries=pass_greylist_retries(settings, job, retry_pass),
        egresses=pinned,
    ):
        fresh.update(settled)
    kept = earlier.filter(~pl.col("normalised").is_in(again)).drop("egress", strict=False)
    by_address = pl.concat([kept, results_frame(fresh)])
    tally = Tally(job_input.row_counts())
    tally.add_statuses(zip(by_address["normalised"], by_address["status"], strict=True))
    return await _end_pass(settings, store, job, job_input, by_address, tally, done_pass=retry_pass)


async def _read_input(settings: Settings, job: job_store.Job) -> JobInput:
    """The job's upload, loaded as the inspection kept with the job says."""
    upload = stored_upload(settings, job)
    return await read_input(
        upload, job.email_column, settings.upload_max_rows, stored_info(settings, job)
    )


async def _end_pass(
    settings: Settings,
    store: Store,
    job: job_store.Job,
    job_input: JobInput,
    by_address: pl.DataFrame,
    tally: Tally,
    *,
    done_pass: int,
    sink: ResultSink | None = None,
) -> dict[str, Any]:
    """After pass ``done_pass`` (0: the first): park the job, its put-off addresses to ask
    again (see :func:`~verimail.flows.job_run.park_or_finish`), or finish it — history,
    result files, and the job completed with its credits settled. ``sink``: the pass's
    result parts, dropped once used."""
    await still_owned(store, job)
    directory = job_dir(settings.data_dir, job.id)
    waiting = await park_or_finish(
        settings,
        job,
        directory,
        by_address,
        key="normalised",
        done_pass=done_pass,
        processed=tally.processed,
        counts=tally.job_counts(),
    )
    if waiting is not None:
        if sink is not None:
            sink.remove()
        return waiting
    await record_history(
        settings.data_dir,
        by_address,
        job_id=job.id,
        account_id=job.account_id,
        source="bulk",
        once_per_job=True,
    )
    files = await write_results(
        directory,
        stored_upload(settings, job),
        job_input,
        by_address,
        run=job.attempt,
        previous=_previous_results(settings, job),
    )
    if sink is not None:
        sink.remove()
    await complete_run(
        store,
        job,
        files,
        tally.job_counts(),
        verify_job_credits(job_input.address_rows, files.sub_statuses or {}),
        processed=tally.processed,
    )
    retries.state_path(directory).unlink(missing_ok=True)
    return {"job_id": job.id, "status": "completed", **tally.job_counts()}


def _previous_results(settings: Settings, job: job_store.Job) -> Path | None:
    """A re-verification's job compares with the results of the run it re-verifies."""
    previous = (job.options or {}).get("reverify_of")
    if previous is None:
        return None
    return job_dir(settings.data_dir, int(previous)) / "results.parquet"


class _Progress:
    """The job's progress as results come: its row (what the API and dashboard poll) and a
    progress artifact in Prefect (a view: a Prefect API slow to answer costs the job
    nothing)."""

    def __init__(
        self, settings: Settings, store: Store, job: job_store.Job, tally: Tally, rows: int
    ) -> None:
        self.settings = settings
        self.store = store
        self.job = job
        self.tally = tally
        self.total = max(rows, 1)
        self.artifact: Any = None
        self.shown = False

    async def show(self) -> None:
        """Write the progress now; the first time, check the run still has the job (a run
        frozen while it read and resolved the list stops here) and open the artifact."""
        percent = 100.0 * self.tally.processed / self.total
        if not self.shown:
            self.shown = True
            await still_owned(self.store, self.job)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(ARTIFACT_TIMEOUT):
                    self.artifact = await acreate_progress_artifact(
                        progress=percent,
                        key=artifact_key(self.settings, f"bulk-job-{self.job.id}-progress"),
                        description=f"Bulk job {self.job.id}: {self.total} addresses",
                    )
        elif self.artifact is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(ARTIFACT_TIMEOUT):
                    await aupdate_progress_artifact(self.artifact, progress=percent)
        await db_retried(self._write)

    def _write(self) -> None:
        job_store.update_progress(
            self.store.engine,
            self.job.id,
            self.tally.processed,
            self.tally.job_counts(),
            unique_emails=len(self.tally.rows),  # (one entry per distinct address)
            attempt=self.job.attempt,
        )
