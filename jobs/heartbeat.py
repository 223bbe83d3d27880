"""A job run's heartbeat, beaten from a thread of its own, and what a run does when a
later run has taken its job over.

Recovery (``jobs/recovery.py``) resumes a job whose heartbeat went quiet. A run must
therefore beat while it works — and not from its event loop: parsing a million addresses
holds that loop for minutes, and a finder task works through many slow domains between
progress writes. A run can be taken for dead all the same (a frozen process, a cut to the
database); its next beat finds the job resumed by a later run, and it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from verimail.files.bulk_io import StagedFiles
from verimail.jobs.context import db_retried
from verimail.store import jobs as job_store
from verimail.store.db import Store

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 15.0  # at most; a quarter of job_stale_after when that is shorter

T = TypeVar("T")


class Superseded(Exception):
    """A later run of the job has it now: this run stopped, and must not settle the job."""


SUPERSEDED = "superseded"


def superseded_outcome(job: job_store.Job, run: int | None = None) -> dict[str, Any]:
    """What a flow returns when it stopped for a later run (:func:`was_superseded`)."""
    return {"job_id": job.id, "status": SUPERSEDED, "run": run or job.attempt}


def started_late(job: job_store.Job, attempt: int | None) -> bool:
    """Whether run ``attempt`` was handed to a runner before the job passed to a later run
    (queued behind other jobs, or waiting in the work pool, while recovery took it for
    dead): it must not start at all. The run number is fixed when the run is submitted —
    read from the job when it starts, it would be the later run's, and two runs would both
    own the job. ``None`` (a run started from the Prefect UI): the job's current run."""
    return attempt is not None and job.attempt != attempt


def was_superseded(outcome: object) -> bool:
    """Whether a flow's return says a later run has the job: the runner must leave it open."""
    return isinstance(outcome, dict) and outcome.get("status") == SUPERSEDED


async def still_owned(store: Store, job: job_store.Job) -> None:
    """Raise :class:`Superseded` unless this run still has the job; called just before a
    run writes the job's results. A run frozen past ``job_stale_after`` is resumed as a
    later run while it may still wake up and finish: without this, it would write its
    results over the later run's (or over a completed job's) before its next beat."""
    beat = await db_retried(job_store.beat_run, store.engine, job.id, job.attempt)
    if beat != "beaten":
        raise Superseded(f"job {job.id}: run {job.attempt} no longer has the job ({beat})")


async def complete_run(
    store: Store,
    job: job_store.Job,
    files: StagedFiles,
    counts: dict[str, int],
    credits_used: int,
    *,
    processed: int,
) -> None:
    """Complete the job as this run's and put its staged result files in place, both under
    the job's row lock (``mark_completed(publish=...)``); raise :class:`Superseded`, the
    files removed, when a later run has the job: its files stand."""
    try:
        completed = await asyncio.to_thread(
            job_store.mark_completed,
            store.engine,
            job.id,
            counts,
            str(files.final("results.csv")),
            credits_used,
            processed=processed,
            attempt=job.attempt,
            publish=files.publish,
            options_update=_counted(files),
        )
    finally:
        files.discard()  # (nothing is left once published)
    if not completed:
        raise Superseded(f"job {job.id}: run {job.attempt} lost the job while writing")


def _counted(files: StagedFiles) -> dict[str, Any] | None:
    """What the staged results counted that the job keeps in its options: a
    re-verification's transitions, the rows refused our sending IP by egress."""
    update: dict[str, Any] = {}
    if files.transitions is not None:
        update["transitions"] = files.transitions
    if files.egress_blocked:
        update["egress_blocked"] = files.egress_blocked
    return update or None


class RunHeartbeat:
    """Beats the job's heartbeat from a thread of its own while the run works, so recovery
    can tell a live job from a dead one.

    Not a task on the run's event loop: parsing a million addresses holds that loop for
    minutes, and a run whose beats wait for the loop looks dead and is started a second
    time beside itself. A beat that fails (the database briefly unreachable) is logged and
    the next one tried; a heartbeat that died of it would look just as dead. When a beat
    finds the job taken over by recovery (resumed as a later run, or failed with its runs
    used up: this one was taken for dead all the same, a frozen process or a cut to the
    database), ``lost`` is set and ``on_lost`` called: the job is no longer this run's.
    Beats stop once the job is finished."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        stale_after: float,
        *,
        attempt: int = 1,
        on_lost: Callable[[], object] | None = None,
        beat: Callable[[], str] | None = None,
        what: str | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.interval = min(HEARTBEAT_SECONDS, stale_after / 4)
        self.attempt = attempt
        self.on_lost = on_lost
        # (a job run's beat by default; a shard run beats its shard: jobs/shards.py)
        self.beat = beat or (lambda: job_store.beat_run(store.engine, job_id, attempt))
        self.what = what or f"job {job_id}"
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"verimail-heartbeat-{job_id}", daemon=True
        )

    def __enter__(self) -> RunHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                beat = self.beat()
            except Exception as exc:
                log.warning("%s: heartbeat failed (%s); trying again", self.what, exc)
                continue
            if beat == "finished":  # (this run's own end)
                return
            if beat == "superseded":
                log.warning(
                    "%s: taken over by recovery (resumed as a later run, or failed); run %s stops",
                    self.what,
                    self.attempt,
                )
                self.lost = True
                if self.on_lost is not None:
                    self.on_lost()
                return


async def as_owner(
    store: Store,
    job: job_store.Job,
    stale_after: float,
    work: Coroutine[Any, Any, T],
    *,
    attempt: int | None = None,
    beat: Callable[[], str] | None = None,
    what: str | None = None,
) -> T:
    """Run ``work`` while beating ``job``'s heartbeat (or, given ``beat``, another's: a
    shard run of the job, as run ``attempt``). If a later run takes the job over,
    ``work`` is cancelled, allowed to unwind (its SMTP sessions hang up), and
    :class:`Superseded` raised."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    run = job.attempt if attempt is None else attempt
    heartbeat = RunHeartbeat(
        store,
        job.id,
        stale_after,
        attempt=run,
        on_lost=lambda: loop.call_soon_threadsafe(task.cancel),
        beat=beat,
        what=what,
    )
    with heartbeat:
        try:
            return await task
        except BaseException:
            if not heartbeat.lost:
                raise
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise Superseded(f"{what or f'job {job.id}'}: run {run} was superseded") from None
