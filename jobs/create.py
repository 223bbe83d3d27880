"""Creating a job and starting its run: the one place every surface goes through.

The API (CSV and JSON bulk, finder CSV, re-verification), the dashboard, the CLI, the
Prefect-UI form, a list's scheduled re-verification and the bench all create their jobs
here, so the same rules hold wherever a job comes from:

- the job row and its credit reservation are one transaction, priced by
  ``store/billing/prices.py``; short of credits, nothing is stored (:class:`NotEnoughCredits`);
- what inspecting the upload learned (encoding, delimiter, header, columns, the email
  column) is kept in the job's folder, so its run loads the file without sniffing it again
  (a file, not the job row: a header may hold a million names, and the row is read on
  every poll);
- a job whose run cannot be started is failed at once with a refund of its reservation
  (:class:`NotStarted`), never left ``pending``.

Each surface words the refusals its own way (an HTTP 402, a form error, a CLI message).
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from verimail.config import Settings
from verimail.files.bulk_io import INFO_FILE, job_dir, load_info, save_info
from verimail.files.csv_detect import CsvInfo
from verimail.schemas.flows import flow_of_job
from verimail.store import jobs as job_store
from verimail.store.billing import balance, quote, short_balance
from verimail.store.db import Store

log = logging.getLogger(__name__)


def run_kind(job: job_store.Job) -> str:
    """The key of the flow that works ``job`` (``schemas/flows.py``: a JSON bulk job is
    verified like a CSV one); a runner's ``kind``."""
    return flow_of_job(job.kind).key


class JobRunner(Protocol):
    """Starts the flow run of a job and returns at once (``runners/`` has the two).

    ``attempt`` is the run number the run is for (recovery's claim gives it; None: the
    job's run now). It is fixed here, at submission: a run that waits (for a worker thread,
    in the work pool) while recovery passes the job to a later run must find that out when
    it starts, not take the later run's number."""

    def submit(
        self,
        kind: str,
        job_id: int,
        attempt: int | None = None,
        *,
        retry_pass: int = 0,
        at: datetime | None = None,
    ) -> None:
        """``retry_pass``/``at``: a parked job's deferred retry pass, to start at ``at``."""

    def submit_shard(self, job_id: int, shard: int, attempt: int) -> None:
        """Start run ``attempt`` of a big job's shard on its own (``flows/shard.py``)."""

    def shutdown(self) -> None: ...


class NotEnoughCredits(Exception):
    """The balance does not cover what the job must reserve (or, for the finder, one find);
    nothing was stored or charged."""

    def __init__(self, needed: int, have: int) -> None:
        super().__init__(f"needs {needed} credits, the balance is {have}")
        self.needed = needed
        self.have = have


class NotStarted(Exception):
    """The job's run could not be started: the job is failed and ``settled`` says what
    became of its credits ("its credits were refunded" / "nothing was charged")."""

    def __init__(self, settled: str) -> None:
        super().__init__(f"The job could not be started; {settled}.")
        self.settled = settled


def create_verify_job(
    store: Store,
    account_id: int,
    total: int,
    *,
    upload: Path,
    kind: Literal["bulk_csv", "bulk_json"] = "bulk_csv",
    info: CsvInfo | None = None,
    email_column: str | None = None,
    options: dict[str, Any] | None = None,
    webhook_url: str | None = None,
    flow_run_id: str | None = None,
) -> job_store.Job:
    """A verification job of ``total`` address rows, their credits reserved with it.

    ``info``: the upload's inspection, stored with the job for its run. Raises
    :class:`NotEnoughCredits` when the balance is short."""
    needed = quote("verify", total)
    job = job_store.create_job(
        store.engine,
        account_id,
        kind,
        total,
        reserve=needed,
        upload_path=str(upload),
        email_column=email_column,
        options=options,
        webhook_url=webhook_url,
        flow_run_id=flow_run_id,
    )
    if job is None:
        raise NotEnoughCredits(needed, balance(store.engine, account_id).total)
    _keep_info(store, job, info)
    return job


def create_finder_job(
    store: Store,
    settings: Settings,
    account_id: int,
    rows: int,
    *,
    upload: Path,
    info: CsvInfo | None = None,
    options: dict[str, Any] | None = None,
    webhook_url: str | None = None,
) -> job_store.Job:
    """A finder job of ``rows`` people. Nothing is reserved (each find is charged as the job
    goes), but a balance that cannot pay for one find is refused up front
    (:class:`NotEnoughCredits`): such a job could only skip every row."""
    cost = quote("find", 1, settings)
    have = short_balance(store.engine, account_id, cost)
    if have is not None:
        raise NotEnoughCredits(cost, have)
    job = job_store.create_job(
        store.engine,
        account_id,
        "finder_csv",
        rows,
        reserve=0,
        upload_path=str(upload),
        options=options,
        webhook_url=webhook_url,
    )
    assert job is not None  # (nothing to reserve, so nothing to refuse)
    _keep_info(store, job, info)
    return job


def submit(store: Store, runner: JobRunner, job: job_store.Job) -> None:
    """Hand a created job to the runner. If it cannot start, the job is failed (which
    refunds its reservation, if any) and :class:`NotStarted` says so: no job is left
    ``pending`` and nothing stays charged."""
    try:
        runner.submit(run_kind(job), job.id, job.attempt)
    except Exception as exc:
        log.exception("could not start job %s", job.id)
        settled = "its credits were refunded" if job.credits_reserved else "nothing was charged"
        job_store.mark_failed(store.engine, job.id, f"The job could not be started; {settled}.")
        raise NotStarted(settled) from exc


def stored_info(settings: Settings, job: job_store.Job) -> CsvInfo | None:
    """The upload's inspection kept with ``job`` (None: nobody inspected it before the run,
    e.g. a JSON bulk job's list, which the service wrote itself; the run sniffs it)."""
    directory = job_dir(settings.data_dir, job.id)
    if not (directory / INFO_FILE).is_file():
        return None
    return load_info(directory)


def stored_upload(settings: Settings, job: job_store.Job) -> Path:
    """The file ``job`` verifies: its upload where one was kept, else the list the service
    wrote into the job's folder (a JSON bulk job's)."""
    return Path(job.upload_path or job_dir(settings.data_dir, job.id) / "upload.csv")


def _keep_info(store: Store, job: job_store.Job, info: CsvInfo | None) -> None:
    """Keep ``info`` in the job's folder (where its run and its download read it). Best
    effort: the job exists already, and a run without it sniffs the file instead."""
    if info is None:
        return
    directory = job_dir(store.settings.data_dir, job.id)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        save_info(directory, info)
    except OSError as exc:
        log.warning("job %s: could not keep its upload's inspection (%s)", job.id, exc)
