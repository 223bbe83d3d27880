"""The ``verify-shard`` flow: one shard of a big bulk job, on whichever worker takes it.

A bulk job of more than ``job_shard_size`` distinct addresses is cut into shards by
domain (``tasks/shards.py``); ``bulk-verify`` makes them and, with workers, hands each to
the work pool as a run of this flow and ends — the job holds no worker while its shards
run. With the local runner the same shards run inside the job's own run, all at once
(:func:`run_shard`; not as concurrent subflows, whose start Prefect 3.8 sometimes never
finished: a job sat with one shard never begun on a busy machine).

A shard run verifies the shard's addresses with the verify pipeline, saving its results
in the job's folder as they come (``files/shards.py``), its progress added up into the
job's. A run that starts again after its worker died verifies only what the earlier runs
had not saved. The run that finishes the last shard asks for the job's merge: a
``bulk-verify`` run of the job again, which finds every shard done, puts their results
together in input order, and completes or parks the job as an unsharded run does. That
run is asked for, like every run, of the run planner (``flows/planner.py``): named "bulk job
12 · merge", made once however many shard runs ask for it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prefect import flow, get_run_logger

from verimail.config import Settings, current_settings
from verimail.files.bulk_io import job_dir
from verimail.files.shards import read_shard_input, shard_results
from verimail.flows.job_run import pass_greylist_retries
from verimail.flows.planner import hand_over, merge_request
from verimail.jobs.context import db_retried, store_for
from verimail.jobs.heartbeat import Superseded, as_owner
from verimail.jobs.tally import Tally
from verimail.store import job_shards
from verimail.store import jobs as job_store
from verimail.store.db import Store
from verimail.tasks.pipeline import verify_pass

PROGRESS_SECONDS = 1.0  # at most one progress write per this many seconds


@flow(name="verify-shard", persist_result=False, log_prints=True)
async def verify_shard(job_id: int, shard: int, attempt: int, merge: bool = True) -> dict[str, Any]:
    """Verify shard ``shard`` of bulk job ``job_id`` as its run ``attempt``; with
    ``merge``, the run that finishes the job's last shard starts the job's merge.

    Args:
        job_id: The big bulk job the shard belongs to (its number). Shard runs are started
            by the job's own run, not by hand.
        shard: Which of the job's shards (from 0), as the job's run planned them.
        attempt: The job's run this shard run works for; a shard run of an earlier run
            stops at once.
        merge: Whether the run that finishes the job's last shard starts the job's merge.
    """
    outcome = await run_shard(job_id, shard, attempt, merge=merge)
    if outcome["status"] == "superseded":
        get_run_logger().info(
            "job %s shard %s: nothing to do: the shard is done, a later run has it, or the "
            "job has ended (shard runs are started by the job's run, not by hand)",
            job_id,
            shard,
        )
    return await hand_over(current_settings(), outcome)


async def run_shard(
    job_id: int, shard: int, attempt: int, *, merge: bool = False
) -> dict[str, Any]:
    """The work of :func:`verify_shard` (also a part of the job's own run: the local runner's
    shards); with ``merge``, the merge of the job follows the last shard (``next_runs``)."""
    settings = current_settings()
    store = store_for(settings)
    outcome: dict[str, Any] = {"job_id": job_id, "shard": shard, "attempt": attempt}
    claimed = await asyncio.to_thread(job_shards.claim, store.engine, job_id, shard, attempt)
    job = await asyncio.to_thread(job_store.get_job_any, store.engine, job_id)
    if claimed is None or job is None:  # (done, or a later run has it, or the job ended)
        return {**outcome, "status": "superseded"}
    what = f"job {job_id} shard {shard + 1}/{(job.options or {})['shards']['total']}"
    try:
        left = await as_owner(
            store,
            job,
            settings.job_stale_after,
            _verify(settings, store, claimed, what, pass_greylist_retries(settings, job, 0)),
            attempt=attempt,
            beat=lambda: job_shards.beat(store.engine, job_id, shard, attempt),
            what=what,
        )
    except Superseded:
        return {**outcome, "status": "superseded"}
    outcome.update(status="done", shards_left=left, merge=merge and left == 0)
    if outcome["merge"]:
        ended = await asyncio.to_thread(job_store.get_job_any, store.engine, job_id)
        if ended is not None and not ended.finished:
            outcome["next_runs"] = [merge_request(settings, ended)]
    return outcome


async def _verify(
    settings: Settings, store: Store, shard: job_shards.Shard, what: str, greylist_retries: int
) -> int:
    """The shard's addresses that earlier runs did not save, verified (``greylist_retries``
    in-pass retries of a greylisted recipient: the job's first pass's); returns how many of
    the job's shards are left to do (0: this was the last)."""
    directory = job_dir(settings.data_dir, shard.job_id)
    given = await asyncio.to_thread(read_shard_input, directory, shard.shard)
    addresses = given.get_column("normalised").to_list()
    tally = Tally(dict(zip(addresses, given.get_column("rows").to_list(), strict=True)))
    parts = shard_results(directory, shard.shard, shard.attempt)
    earlier = await asyncio.to_thread(parts.frame)
    saved = set(earlier.get_column("normalised").to_list())
    tally.add_statuses(zip(earlier["normalised"], earlier["status"], strict=True))
    todo = [address for address in addresses if address not in saved]
    get_run_logger().info(
        "%s: %s addresses, %s saved by earlier runs", what, len(addresses), len(saved)
    )
    del given, earlier, saved
    shown = time.monotonic()
    async for settled in verify_pass(todo, what=what, greylist_retries=greylist_retries):
        parts.add(settled)
        await asyncio.to_thread(parts.flush)  # (saved as it comes: a later run keeps it)
        tally.add(settled)
        del settled
        if time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            await _record(store, shard, tally, done=False)
    return await _record(store, shard, tally, done=True)


async def _record(store: Store, shard: job_shards.Shard, tally: Tally, *, done: bool) -> int:
    left = await db_retried(
        job_shards.record_progress,
        store.engine,
        shard.job_id,
        shard.shard,
        shard.attempt,
        tally.processed,
        tally.job_counts(),
        done=done,
    )
    if left is None:
        raise Superseded(f"job {shard.job_id} shard {shard.shard}: run {shard.attempt} lost it")
    return left
