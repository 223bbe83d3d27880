"""No job stuck: resume or fail jobs whose run went quiet.

A job's run beats its heartbeat while it works. A job that is ``processing`` (or
``pending``) with no beat for ``job_stale_after`` seconds lost its runner — the API process
or worker died. It is resumed (a fresh run restarts it; nothing was charged twice because
credits were reserved once at creation) until ``job_max_attempts`` runs were made, then
failed with a refund of what it did not verify.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy.exc import OperationalError

from verimail.config import Settings
from verimail.jobs.context import store_for
from verimail.jobs.create import JobRunner, run_kind
from verimail.jobs.notify import deliver_owed_webhooks, notify_job_soon
from verimail.store import job_shards
from verimail.store import jobs as job_store
from verimail.store.db import utcnow
from verimail.store.job_retries import claim_for_resume, due_retries

log = logging.getLogger(__name__)

RETRY_CATCH_UP = timedelta(seconds=5)
"""How late a parked job's pass may be before the reaper starts it (the timer goes first)."""


def recover_stale_jobs(settings: Settings, runner: JobRunner) -> list[tuple[int, str]]:
    """One sweep: returns (job id, "resumed" | "failed") for each stale job handled.

    First beats the jobs this process's runner still holds (queued behind other jobs, or
    whose flow run is starting): only a flow beats by itself, and only once it runs, so
    without this a job waiting for a worker thread longer than ``job_stale_after`` looked
    dead — and was started a second time and failed as out of attempts.
    """
    store = store_for(settings)
    held = getattr(runner, "held_jobs", None)
    if held is not None:
        held_jobs = held()
        job_store.keep_alive(store.engine, held_jobs)
        job_shards.keep_alive_of_jobs(store.engine, held_jobs)  # (the shards their runs run)
    held_shards = getattr(runner, "held_shards", None)
    if held_shards is not None:
        job_shards.keep_alive(store.engine, held_shards())
    handled: list[tuple[int, str]] = []
    for job in due_retries(store.engine, now=utcnow() - RETRY_CATCH_UP):
        # A parked job whose next pass did not start (its timer died with a process): start
        # it now; the pass is claimed by the first run, so a late timer changes nothing.
        runner.submit(run_kind(job), job.id, job.attempt, retry_pass=int(job.retry["pass"]))
        handled.append((job.id, "retry pass"))
    stale = job_store.find_stale_processing(
        store.engine, timedelta(seconds=settings.job_stale_after), include_pending=True
    )
    for job in stale:
        if job.retry.get("phase") == "waiting_to_retry":
            continue  # (parked, and its pass is just being started above)
        if _shards_at_work(job):
            continue  # (its shards are watched one by one below)
        attempt = claim_for_resume(store.engine, job.id, job.heartbeat_at)
        if attempt is None:
            continue  # another process took it, or it finished
        if attempt <= settings.job_max_attempts:
            # (A retry pass that died is done again, not the whole job: the claim reopened it.)
            retry_pass = int(job.retry["pass"]) if job.retry.get("phase") == "retrying" else 0
            log.warning("job %s lost its runner; resuming (run %s)", job.id, attempt)
            try:
                runner.submit(run_kind(job), job.id, attempt, retry_pass=retry_pass)
                handled.append((job.id, "resumed"))
                continue
            except Exception as exc:  # could not even start a run: fail below
                log.exception("resuming job %s failed: %s", job.id, exc)
        if job_store.mark_failed(
            store.engine,
            job.id,
            "The job's runner stopped (process or worker died) and it could not be resumed.",
            job_store.UNVERIFIED,
        ):
            notify_job_soon(settings, job.id)
        handled.append((job.id, "failed"))
    handled += _recover_stale_shards(settings, runner)
    handled += [(job_id, "webhook") for job_id in deliver_owed_webhooks(settings)]
    return handled


def _shards_at_work(job: job_store.Job) -> bool:
    """A sharded job some of whose shards are not done: no run of the job itself holds it
    (with workers its first run ended once the shards were handed out), so its own
    heartbeat says nothing — each shard's does. Once all are done, a job whose merge went
    quiet is resumed like any job."""
    shards = (job.options or {}).get("shards")
    return shards is not None and shards["done"] < shards["total"]


def _recover_stale_shards(settings: Settings, runner: JobRunner) -> list[tuple[int, str]]:
    """Give each shard whose run went quiet (its worker died, or it was never started)
    another run of its own, the other shards untouched; a shard out of runs
    (``job_max_attempts``) fails its job with the refund of what was not verified."""
    store = store_for(settings)
    handled: list[tuple[int, str]] = []
    stale = job_shards.stale_shards(store.engine, timedelta(seconds=settings.job_stale_after))
    for shard in stale:
        attempt = job_shards.assign(
            store.engine, shard.job_id, shard.shard, seen_heartbeat=shard.heartbeat_at
        )
        if attempt is None:
            continue  # another process took it, or it finished
        if attempt <= settings.job_max_attempts:
            log.warning(
                "job %s shard %s lost its runner; running it again (run %s)",
                shard.job_id, shard.shard, attempt,
            )  # fmt: skip
            try:
                runner.submit_shard(shard.job_id, shard.shard, attempt)
                handled.append((shard.job_id, f"shard {shard.shard} resumed"))
                continue
            except Exception as exc:
                log.exception("resuming job %s shard %s failed: %s", shard.job_id, shard.shard, exc)
        if job_store.mark_failed(
            store.engine,
            shard.job_id,
            "A part of the job could not be finished: its runner stopped (process or worker "
            "died) too many times.",
            job_store.UNVERIFIED,
        ):
            notify_job_soon(settings, shard.job_id)
        handled.append((shard.job_id, "failed"))
    return handled


class Reaper:
    """Runs ``recover_stale_jobs`` at start-up and then every quarter of the stale time."""

    def __init__(self, settings: Settings, runner: JobRunner) -> None:
        self.settings = settings
        self.runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="verimail-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        interval = max(self.settings.job_stale_after / 4, 0.5)
        down = False  # the database did not answer the last sweep
        while not self._stop.is_set():
            try:
                recover_stale_jobs(self.settings, self.runner)
                if down:
                    log.warning("job recovery sweep: the database answers again")
                down = False
            except OperationalError as exc:
                # A database that is down: one line a sweep (the traceback, ~40 frames
                # every few seconds, said nothing more), and the traceback once.
                if down:
                    log.warning("job recovery sweep: the database still does not answer")
                else:
                    log.exception("job recovery sweep: the database does not answer: %s", exc)
                down = True
            except Exception:
                log.exception("job recovery sweep failed")
            self._start_due_runs()
            self._stop.wait(interval)

    def _start_due_runs(self) -> None:
        """A runner that is its own worker (the local one) starts the lists' scheduled
        re-verifications that are due."""
        start = getattr(self.runner, "start_due_runs", None)
        if start is None:
            return
        try:
            start()
        except Exception as exc:  # (the database or Prefect down: the next sweep tries again)
            log.warning("starting due scheduled re-verifications failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
