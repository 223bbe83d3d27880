"""Jobs (bulk CSV/JSON verification, finder CSV, re-verification): the job row and its states.

Why one long file: every transition of a job row, so the state machine below and its
conditional writes are read in one place.

States: ``pending → processing → completed | failed``, and ``pending → failed``. Nothing
leaves ``completed`` or ``failed``. Every transition is a conditional write on the current
status, so a late or duplicated call (a retried flow, the stale-job reaper racing a slow
worker) changes nothing and reports False instead of corrupting the job.

Credits: a job reserves at creation in the *same* transaction that inserts it, and what it
does not use comes back in the same transaction as its final transition; how much, and
under which reference, is billing's (:mod:`verimail.store.billing.job_charges`).

Beside this module: the row's lock and whose run has it (``job_lock.py``), a job taken up
again — resumed, or parked for a deferred retry pass (``job_retries.py``) — and its webhook
outbox (``job_webhooks.py``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Engine, Row, case, func, insert, select, update

from verimail.schemas.limits import MAX_INT
from verimail.store.billing.job_charges import (
    refund_finds_in,
    refund_reservation_in,
    reserve_in,
)
from verimail.store.billing.pools import lock_account
from verimail.store.db import utcnow, write_tx
from verimail.store.job_lock import (
    TERMINAL_STATUSES,
    attempts,
    lock_job,
    options_of,
    run_owns,
    store_options,
)
from verimail.store.tables import JOB_KINDS, jobs

JobKind = Literal["bulk_csv", "bulk_json", "finder_csv", "reverify"]
JobStatus = Literal["pending", "processing", "completed", "failed"]

COUNT_COLUMNS = (
    "valid_count",
    "invalid_count",
    "catch_all_count",
    "disposable_count",
    "unknown_count",
    "risky_count",
    "likely_valid_count",
    "found_count",
)
# Counts may be keyed by column name, by column name without ``_count``, or by verdict
# status (``catchall`` is the status spelling of ``catch_all``).
_COUNT_ALIASES = {
    **{c: c for c in COUNT_COLUMNS},
    **{c.removesuffix("_count"): c for c in COUNT_COLUMNS},
    "catchall": "catch_all_count",
}


@dataclass(frozen=True)
class Job:
    """A job row; ``options`` is the decoded JSON of the column."""

    id: int
    public_id: str
    account_id: int
    kind: str
    status: str
    total_emails: int
    unique_emails: int | None
    processed_emails: int
    valid_count: int
    invalid_count: int
    catch_all_count: int
    disposable_count: int
    unknown_count: int
    risky_count: int
    likely_valid_count: int
    found_count: int
    credits_reserved: int
    credits_used: int
    credits_refunded: int
    upload_path: str | None
    result_path: str | None
    email_column: str | None
    options: dict[str, Any] | None
    failed_reason: str | None
    flow_run_id: str | None
    webhook_url: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    heartbeat_at: datetime | None

    @property
    def finished(self) -> bool:
        """True once completed or failed (downloads before that are a 409)."""
        return self.status in TERMINAL_STATUSES

    @property
    def attempt(self) -> int:
        """Which run of the job this is: 1, then one more each time recovery resumes it."""
        return attempts(self.options)

    @property
    def retry(self) -> dict[str, Any]:
        """The deferred-retry state (``store/job_retries.py``'s ``park_for_retry``):
        ``phase``, ``pass``, ``waiting``, ``next_retry_at`` (ISO 8601); empty before any
        parking."""
        return dict((self.options or {}).get("retry") or {})

    @property
    def credits_unsettled(self) -> int:
        """Reserved credits neither used nor refunded yet."""
        return max(self.credits_reserved - self.credits_used - self.credits_refunded, 0)


def job_from_row(row: Row[Any]) -> Job:
    """The :class:`Job` of a row of the jobs table."""
    values = dict(row._mapping)
    values["options"] = json.loads(values["options"]) if values["options"] else None
    return Job(**values)


def count_values(counts: dict[str, int] | None) -> dict[str, int]:
    """Map caller count keys onto ``*_count`` columns; unknown keys are a bug, so raise."""
    values: dict[str, int] = {}
    for key, value in (counts or {}).items():
        column = _COUNT_ALIASES.get(key)
        if column is None:
            raise ValueError(f"unknown count {key!r}; expected one of {', '.join(COUNT_COLUMNS)}")
        values[column] = int(value)
    return values


def new_public_id(kind: str) -> str:
    """A public job id: ``fj_…`` for finder CSV jobs (SPEC §2.7's string ids), ``job_…`` else."""
    return ("fj_" if kind == "finder_csv" else "job_") + secrets.token_hex(10)


class _ShortOfCredits(Exception):
    """Rolls back a job insert whose reservation failed."""


# --- creation ------------------------------------------------------------------------------


def create_job(
    engine: Engine,
    account_id: int,
    kind: JobKind,
    total: int,
    *,
    reserve: int,
    unique_emails: int | None = None,
    upload_path: str | None = None,
    email_column: str | None = None,
    options: dict[str, Any] | None = None,
    webhook_url: str | None = None,
    flow_run_id: str | None = None,
    now: datetime | None = None,
) -> Job | None:
    """Create a pending job and reserve ``reserve`` credits for it, atomically.

    Returns None (and writes nothing) when the account cannot cover the reservation — the
    API's 402. The ledger rows reference ``job:<id>``.
    """
    if kind not in JOB_KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    if reserve < 0 or total < 0:
        raise ValueError("total and reserve must be >= 0")
    now = now or utcnow()
    if webhook_url:  # (its delivery is owed once the job finishes: see the webhook outbox)
        options = {**(options or {}), "webhook_owed": True}
    try:
        with write_tx(engine) as conn:
            lock_account(conn, account_id)  # serialise with other credit movements first
            job_id = conn.execute(
                insert(jobs)
                .values(
                    public_id=new_public_id(kind),
                    account_id=account_id,
                    kind=kind,
                    status="pending",
                    total_emails=total,
                    unique_emails=unique_emails,
                    credits_reserved=reserve,
                    upload_path=upload_path,
                    email_column=email_column,
                    options=json.dumps(options) if options is not None else None,
                    webhook_url=webhook_url,
                    flow_run_id=flow_run_id,
                    created_at=now,
                )
                .returning(jobs.c.id)
            ).scalar_one()
            if not reserve_in(
                conn,
                account_id,
                job_id,
                reserve,
                reason=f"{kind} job {job_id}: {total} rows",
                now=now,
            ):
                raise _ShortOfCredits
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
    except _ShortOfCredits:
        return None
    return job_from_row(row)


# Both names: the brief asked for each; they are the same atomic operation.
create_job_with_reservation = create_job


# --- reads ---------------------------------------------------------------------------------


def _one(engine: Engine, *where: Any) -> Job | None:
    with engine.connect() as conn:
        row = conn.execute(select(jobs).where(*where)).one_or_none()
    return job_from_row(row) if row else None


MAX_ID = MAX_INT
"""Largest id the jobs table's ``INTEGER`` key holds on PostgreSQL (SQLite's goes higher, but
ids are never allocated past this on either); a bigger one (from a URL) names no job, and
is answered without a query — PostgreSQL would raise "integer out of range"."""

_PUBLIC_ID = re.compile(r"[A-Za-z0-9_]{1,64}")


def get_job(engine: Engine, account_id: int, job_id: int) -> Job | None:
    """The account's job by integer id; None for unknown ids *and* other accounts' jobs (404).

    Ids outside 1..``MAX_ID`` are None without a query: SQLite's driver raises on them.
    """
    if not 0 < job_id <= MAX_ID:
        return None
    return _one(engine, jobs.c.id == job_id, jobs.c.account_id == account_id)


def get_job_by_public_id(engine: Engine, account_id: int, public_id: str) -> Job | None:
    """The account's job by public id (finder CSV job ids); None for others' jobs.

    Anything that is not id-shaped is None without a query (a NUL byte from a URL would
    make PostgreSQL raise).
    """
    if not _PUBLIC_ID.fullmatch(public_id):
        return None
    return _one(engine, jobs.c.public_id == public_id, jobs.c.account_id == account_id)


def get_job_any(engine: Engine, job_id: int) -> Job | None:
    """Any account's job: for workers and flows, never for request handlers."""
    return _one(engine, jobs.c.id == job_id)


def list_jobs(
    engine: Engine,
    account_id: int,
    kind: JobKind | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[Job]:
    """The account's jobs, newest first."""
    query = select(jobs).where(jobs.c.account_id == account_id)
    if kind is not None:
        query = query.where(jobs.c.kind == kind)
    query = query.order_by(jobs.c.id.desc()).limit(limit).offset(offset)
    with engine.connect() as conn:
        return [job_from_row(row) for row in conn.execute(query)]


def find_stale_processing(
    engine: Engine,
    older_than: timedelta,
    *,
    now: datetime | None = None,
    include_pending: bool = False,
) -> list[Job]:
    """Jobs whose worker went quiet: processing with no heartbeat for ``older_than``.

    A reaper fails these (with a refund) so a crashed flow run never leaves a job in
    ``processing`` forever. ``include_pending`` also returns jobs created that long ago
    and never started (e.g. the API died before starting their flow run).
    """
    cutoff = (now or utcnow()) - older_than
    last_sign = func.coalesce(jobs.c.heartbeat_at, jobs.c.started_at, jobs.c.created_at)
    statuses = ["processing", "pending"] if include_pending else ["processing"]
    query = select(jobs).where(jobs.c.status.in_(statuses), last_sign < cutoff).order_by(jobs.c.id)
    with engine.connect() as conn:
        return [job_from_row(row) for row in conn.execute(query)]


# --- transitions ---------------------------------------------------------------------------


def _set_if(
    engine: Engine,
    job_id: int,
    status: str | None,
    values: dict[str, Any],
    attempt: int | None = None,
) -> bool:
    """Update the job only while it is in ``status`` (None: in any) and, given ``attempt``,
    still that run's (:func:`run_owns`); True when it was."""
    where = [jobs.c.id == job_id] + ([jobs.c.status == status] if status is not None else [])
    with write_tx(engine) as conn:
        if attempt is not None:
            job = lock_job(conn, job_id)
            if job is None or not run_owns(job, attempt):
                return False
        result = conn.execute(update(jobs).where(*where).values(**values))
    return result.rowcount == 1


def mark_processing(
    engine: Engine,
    job_id: int,
    *,
    unique_emails: int | None = None,
    flow_run_id: str | None = None,
    now: datetime | None = None,
) -> bool:
    """pending → processing (starts the heartbeat clock). False if not pending."""
    now = now or utcnow()
    values: dict[str, Any] = {"status": "processing", "started_at": now, "heartbeat_at": now}
    if unique_emails is not None:
        values["unique_emails"] = unique_emails
    if flow_run_id is not None:
        values["flow_run_id"] = flow_run_id
    return _set_if(engine, job_id, "pending", values)


def remember_first_run(engine: Engine, job_id: int, flow_run_id: str) -> None:
    """Keep the flow run that started the job (the run a person started, or the API's):
    the job's summary lands there, whichever run ends the job. The first call wins."""
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or "first_flow_run_id" in options_of(job):
            return
        store_options(conn, job_id, {**options_of(job), "first_flow_run_id": flow_run_id})


def update_progress(
    engine: Engine,
    job_id: int,
    processed: int,
    counts: dict[str, int] | None = None,
    *,
    credits_used: int | None = None,
    unique_emails: int | None = None,
    attempt: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Record progress (absolute numbers, not increments) and beat; False unless processing
    (and, given ``attempt``, still that run's: see :func:`run_owns`).

    Jobs that charge as they go (finder CSV) pass ``credits_used`` so a later failure
    knows what was spent; bulk runs pass ``unique_emails`` once they have read the list.
    """
    values: dict[str, Any] = {
        "processed_emails": processed,
        "heartbeat_at": now or utcnow(),
        **count_values(counts),
    }
    if credits_used is not None:
        values["credits_used"] = credits_used
    if unique_emails is not None:
        values["unique_emails"] = unique_emails
    return _set_if(engine, job_id, "processing", values, attempt)


def heartbeat(engine: Engine, job_id: int, *, now: datetime | None = None) -> bool:
    """Show the job's worker is alive; False unless processing."""
    return _set_if(engine, job_id, "processing", {"heartbeat_at": now or utcnow()})


RunBeat = Literal["beaten", "superseded", "finished"]


def beat_run(engine: Engine, job_id: int, attempt: int, *, now: datetime | None = None) -> RunBeat:
    """A run's heartbeat: "beaten" while the job is processing and still this run's;
    "superseded" once recovery took it from this run (resumed it as a later run, or, with
    no runs left, failed it: either way the run must stop); "finished" once this run
    completed or failed it."""
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None:
            return "finished"
        if not run_owns(job, attempt):
            return "superseded"
        if job.status in TERMINAL_STATUSES:
            return "finished"
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(heartbeat_at=now or utcnow()))
    return "beaten"


def unfinished_flow_runs(engine: Engine) -> dict[int, str]:
    """Pending or processing jobs that name a flow run: job id → flow run id (for the
    deployment runner, which asks Prefect which of those runs are still queued)."""
    query = select(jobs.c.id, jobs.c.flow_run_id).where(
        jobs.c.status.in_(("pending", "processing")), jobs.c.flow_run_id.is_not(None)
    )
    with engine.connect() as conn:
        return {row.id: row.flow_run_id for row in conn.execute(query)}


def keep_alive(engine: Engine, job_ids: list[int], *, now: datetime | None = None) -> int:
    """Beat the heartbeat of unfinished jobs a live runner holds (pending ones included);
    returns how many were beaten."""
    if not job_ids:
        return 0
    now = now or utcnow()
    # (never backwards: a job parked for a deferred retry has its next beat in the future)
    beat = case((jobs.c.heartbeat_at > now, jobs.c.heartbeat_at), else_=now)
    with write_tx(engine) as conn:
        result = conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(job_ids), jobs.c.status.in_(("pending", "processing")))
            .values(heartbeat_at=beat)
        )
    return result.rowcount


def mark_completed(
    engine: Engine,
    job_id: int,
    counts: dict[str, int] | None,
    result_path: str | None,
    credits_used: int,
    *,
    processed: int | None = None,
    attempt: int | None = None,
    now: datetime | None = None,
    publish: Callable[[], None] | None = None,
    options_update: dict[str, Any] | None = None,
) -> bool:
    """processing → completed, refunding reserved credits beyond ``credits_used`` (given
    ``attempt``, only while that run has the job: :func:`run_owns`). ``publish`` (putting
    the run's result files in place) is called under the job's row lock once that holds,
    so no later run can take the job between the check and the files.

    Reservations are an upper bound (1 per uploaded row); a job that charges less — say
    only unique addresses — gets the difference back here, in the same transaction.
    Jobs that charge as they go (finder CSV: ``charge`` per find) reserve 0 and just
    record ``credits_used``. ``options_update`` is merged into the job's ``options`` (a
    re-verification's transitions). False, and nothing changed, unless the job was processing.
    """
    now = now or utcnow()
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status != "processing" or not run_owns(job, attempt):
            return False
        if publish is not None:
            publish()
        unused = job.credits_reserved - job.credits_refunded - credits_used
        refunded = refund_reservation_in(conn, job, unused, "reserved credits not used", now)
        values: dict[str, Any] = {
            "status": "completed",
            "result_path": result_path,
            "credits_used": credits_used,
            "credits_refunded": job.credits_refunded + refunded,
            "completed_at": now,
            "heartbeat_at": now,
            **count_values(counts),
        }
        if processed is not None:
            values["processed_emails"] = processed
        if options_update:
            values["options"] = json.dumps({**options_of(job), **options_update})
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
    return True


UNVERIFIED: Literal["unverified"] = "unverified"
"""``mark_failed``'s refund of what the job did not verify, read from the locked row."""


def mark_failed(
    engine: Engine,
    job_id: int,
    reason: str,
    refund: int | Literal["unverified"] | None = None,
    *,
    attempt: int | None = None,
    keep_finds: Collection[int] = (),
    now: datetime | None = None,
) -> bool:
    """pending|processing → failed, refunding in the same transaction; given ``attempt``,
    only while that run has the job (:func:`run_owns`): a run that was resumed as a later
    one must not fail the job the later run is doing.

    ``refund`` is what the job did not verify (SPEC: a failed job refunds that):
    :data:`UNVERIFIED` counts it from the locked row — the reservation less the rows
    processed — so a progress write that lands after the caller looked cannot make it
    refund rows that were verified; None refunds the whole unsettled reservation. It is
    capped at what was reserved and not yet refunded. Idempotent: a job already failed (or
    completed) is left alone, returns False and is never refunded twice.

    ``keep_finds``: a finder job's rows whose finds were handed over all the same (a job
    its owner stopped: its partial results); their charges stay, every other find is
    given back.
    """
    now = now or utcnow()
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status in TERMINAL_STATUSES or not run_owns(job, attempt):
            return False
        unsettled = job.credits_reserved - job.credits_used - job.credits_refunded
        if refund == UNVERIFIED:
            wanted = max(job.credits_reserved - job.processed_emails, 0)
        else:
            wanted = unsettled if refund is None else refund
        refunded = refund_reservation_in(conn, job, wanted, "refund of a failed job", now)
        # (A finder job reserves nothing: its finds come back as ledger refunds under their
        # own references, and its credits_used drops to what the kept finds cost.)
        kept = refund_finds_in(conn, job, now, keep_finds) if job.kind == "finder_csv" else 0
        total_refunded = job.credits_refunded + refunded
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(
                status="failed",
                failed_reason=reason,
                credits_refunded=total_refunded,
                # (its last flushed count could still hold a find a run had given back)
                credits_used=kept
                if job.kind == "finder_csv"
                else max(job.credits_reserved - total_refunded, 0),
                completed_at=now,
                heartbeat_at=now,
            )
        )
    return True


def set_flow_run_id(
    engine: Engine, job_id: int, flow_run_id: str, *, attempt: int | None = None
) -> bool:
    """Record which Prefect flow run works on the job (shown in the UI and logs); given
    ``attempt``, only while the job is still that run's. The deployment runner reads the
    recorded run's state to tell a job queued for a worker from a dead one: a run handed
    to the pool after the job passed to a later run (the reaper resumed it meanwhile) must
    not stand for the later run — once it ended, the job looked dead and was resumed again,
    until it failed as out of attempts."""
    return _set_if(engine, job_id, None, {"flow_run_id": flow_run_id}, attempt)


RESULT_COUNT_COLUMNS = (
    "valid_count",
    "likely_valid_count",
    "catch_all_count",
    "risky_count",
    "unknown_count",
    "disposable_count",
    "invalid_count",
)


def result_totals(engine: Engine, account_id: int) -> dict[str, int]:
    """The account's verification counts summed over all its jobs (the dashboard's
    across-jobs breakdown): one aggregate query, however many jobs there are."""
    columns = [func.coalesce(func.sum(jobs.c[name]), 0) for name in RESULT_COUNT_COLUMNS]
    query = select(*columns).where(jobs.c.account_id == account_id, jobs.c.kind != "finder_csv")
    with engine.connect() as conn:
        row = conn.execute(query).one()
    return {name: int(value) for name, value in zip(RESULT_COUNT_COLUMNS, row, strict=True)}
