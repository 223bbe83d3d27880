"""Deferred retries of an operator's ``reverify-stored`` run: where its parked addresses
wait, and the Prefect run that comes back for them.

A run over a job, a file or the stale addresses charges nobody and has no job row. It
settles what it can and writes its change report. Addresses the servers put off
(:data:`~verimail.jobs.retries.RETRYABLE`: greylisted, other 4xx, timeouts, refused
connections) are *parked*, as a bulk job's are: what the next pass needs waits beside the
report in ``<report stem>.retry.json`` (the addresses, their statuses before the first
pass, the pass, its time, the delay used so far, the envelope sender), and a follow-up run
of ``reverify-stored`` is planned for that time with the parameters ``retry_of`` (the
report's name) and ``retry_pass``. No worker is held meanwhile: with workers it is a
Scheduled run of the deployment; with the local runner a Scheduled run of no deployment,
tagged :data:`RUN_TAG`, which the API process's sweep claims once due, as it claims lists'
scheduled runs (``LocalRunner.start_due_runs``).

The follow-up takes its pass by renaming the file to ``<report stem>.retrying.json`` (one
run gets it), asks the parked addresses again, and parks what is still put off again or
ends, within ``job_retry_passes`` and ``job_retry_max_wait`` as jobs do. A planned run that
ends without taking its pass (cancelled or deleted in Prefect) leaves its file behind: the
reaper's sweep removes it once it is overdue, and the report stays as it is.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ValidationError

from verimail.config import Settings
from verimail.flows.reverify_lists import create_planned_run
from verimail.jobs import retries
from verimail.schemas.results import VerificationResult

log = logging.getLogger(__name__)

RUN_TAG = "verimail-reverify-retry"
"""Tag of every planned follow-up run (the local runner claims due runs by it)."""
REPORT_NAME = re.compile(r"reverify-[0-9]{8}T[0-9]+\.csv")
WAITING = ".retry.json"
TAKEN = ".retrying.json"


class Parked(BaseModel):
    """A pass of a re-verification: what the next pass needs (the file beside its
    report), or, with ``retry_pass`` 0, the first run's own."""

    report: str
    """The change report's file name, in ``<data_dir>/reports``."""
    retry_pass: int
    next_retry_at: datetime
    """When the pass is due (the first run: when it ran)."""
    waited: float
    """Seconds of retry delay planned so far, this pass's included."""
    addresses: list[str]
    previous: dict[str, tuple[str, datetime | None]]
    """Status and time of each address's verification before the first pass (the
    first pass's own results are in the history now; the report compares with these)."""
    mail_from: str
    """The envelope sender the first pass used (greylisting lets that triplet pass)."""
    job_id: int | None
    what: str
    """What the run re-verifies, as its name says (``job 12``, ``leads.csv``)."""
    artifact: str
    flow_run_id: str | None = None


def retryable(results: Iterable[tuple[str, VerificationResult]]) -> list[str]:
    """The addresses whose results a later pass may settle."""
    return [address for address, result in results if result.sub_status.value in retries.RETRYABLE]


def reports_dir(settings: Settings) -> Path:
    return Path(settings.data_dir) / "reports"


def _path(settings: Settings, report: str, suffix: str) -> Path:
    if not REPORT_NAME.fullmatch(report):
        raise ValueError(f"{report!r} is not the name of a change report (reverify-<time>.csv).")
    return reports_dir(settings) / (report.removesuffix(".csv") + suffix)


async def park(settings: Settings, done: Parked, waiting: list[str]) -> Parked | None:
    """After pass ``done`` (``retry_pass`` 0: the first run): park ``waiting`` for the next
    pass — its run planned in Prefect, what it needs saved beside the report — and return
    it; None when no pass is left (``job_retry_passes``, ``job_retry_max_wait``), or when
    Prefect cannot plan the run (logged): the report then stays as this pass left it."""
    planned = retries.plan(settings, done.retry_pass, done.waited)
    if planned is None:
        return None
    retry_pass, at, waited = planned
    try:
        run_id = await create_planned_run(
            settings,
            {"retry_of": done.report, "retry_pass": retry_pass},
            at,
            name=f"reverify {done.what}: retry pass {retry_pass}",
            tags=[RUN_TAG],
        )
    except Exception as exc:
        log.warning("could not plan retry pass %s of %s: %s", retry_pass, done.report, exc)
        return None
    parked = done.model_copy(
        update={
            "retry_pass": retry_pass,
            "next_retry_at": at,
            "waited": waited,
            "addresses": waiting,
            "previous": {a: done.previous[a] for a in waiting if a in done.previous},
            "flow_run_id": run_id,
        }
    )
    # (Saved once the run exists, so the file always names it. The run is due a delay
    # later and finds the file; one that starts without it ends with nothing to do.)
    path = _path(settings, parked.report, WAITING)
    partial = path.with_suffix(".partial")
    partial.write_text(parked.model_dump_json())
    partial.replace(path)
    return parked


def take(settings: Settings, report: str, retry_pass: int) -> Parked | None:
    """Take pass ``retry_pass`` of ``report`` for this run; None when it does not wait (an
    earlier run took it, or the retries ended). ValueError for a name that is no report's."""
    waiting, taken = _path(settings, report, WAITING), _path(settings, report, TAKEN)
    parked = _read(waiting)
    if parked is None or parked.retry_pass != retry_pass:
        return None
    try:
        waiting.rename(taken)  # (atomic: of two runs, one gets it)
    except FileNotFoundError:
        return None
    got = _read(taken)
    if got is None or got.retry_pass != retry_pass:  # (a later pass's, parked meanwhile)
        with contextlib.suppress(OSError):
            taken.rename(waiting)
        return None
    return got


def release(settings: Settings, report: str) -> None:
    """The pass taken by :func:`take` is over (a next pass, if any, waits in its own file)."""
    _path(settings, report, TAKEN).unlink(missing_ok=True)


def _read(path: Path) -> Parked | None:
    try:
        return Parked.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def _waiting(settings: Settings) -> Iterator[tuple[Path, Parked]]:
    for path in reports_dir(settings).glob(f"*{WAITING}"):
        parked = _read(path)
        if parked is not None:
            yield path, parked


def any_due(settings: Settings) -> bool:
    """Whether a parked pass is due (files only: Prefect is not asked)."""
    now = datetime.now(UTC)
    return any(parked.next_retry_at <= now for _, parked in _waiting(settings))


def drop_lost_runs(settings: Settings) -> list[str]:
    """Parked passes overdue by more than ``job_stale_after`` whose planned run will never
    take them (cancelled or deleted in Prefect, ended without starting): their files are
    removed, so the sweep stops asking, and the reports stay as they are. Returns their
    reports' names."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    overdue = datetime.now(UTC) - timedelta(seconds=settings.job_stale_after)
    dropped = []
    with get_client(sync_client=True) as client:
        for path, parked in _waiting(settings):
            if parked.next_retry_at > overdue:
                continue
            run = None
            with contextlib.suppress(ObjectNotFound, ValueError, TypeError):
                run = client.read_flow_run(uuid.UUID(str(parked.flow_run_id)))
            if run is not None and run.state is not None and not run.state.is_final():
                continue  # (late, claimed, or running)
            if _read(path) != parked:  # (its run took it and parked the next pass just now)
                continue
            path.unlink(missing_ok=True)
            log.warning(
                "%s: retry pass %s was not run (its planned run %s was cancelled or removed "
                "in Prefect); the report stays as it is",
                parked.report,
                parked.retry_pass,
                parked.flow_run_id,
            )
            dropped.append(parked.report)
    return dropped
