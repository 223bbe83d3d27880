"""Deferred retries of an operator's ``reverify-stored`` run, as files: where its parked
addresses wait for the next pass, and how a pass takes them.

A run over a job, a file or the stale addresses charges nobody and has no job row. It
settles what it can and writes its change report. Addresses the servers put off
(:data:`~verimail.jobs.retries.RETRYABLE`: greylisted, other 4xx, timeouts, refused
connections) are *parked*, as a bulk job's are: what the next pass needs waits beside the
report in ``<report stem>.retry.json`` (the addresses, their statuses before the first
pass, the pass, its time, the delay used so far, the envelope sender), and a follow-up run
of ``reverify-stored`` is planned for that time (``flows/reverify.py``) with the parameters
``retry_of`` (the report's name) and ``retry_pass``. No worker is held meanwhile.

The follow-up takes its pass by renaming the file to ``<report stem>.retrying.json`` (one
run gets it), asks the parked addresses again, and parks what is still put off again or
ends, within ``job_retry_passes`` and ``job_retry_max_wait`` as jobs do. A planned run that
ends without taking its pass (cancelled or deleted in Prefect) leaves its file behind: the
sweep of the runners removes it once it is overdue (``runners/sweep.py``), and the report
stays as it is.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from verimail.config import Settings
from verimail.jobs import retries
from verimail.schemas.results import VerificationResult

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


def save(settings: Settings, parked: Parked) -> None:
    """Keep what pass ``parked.retry_pass`` needs beside its report, for its planned run
    (saved once the run exists, so the file always names it: the run is due a delay later
    and finds the file; one that starts without it ends with nothing to do)."""
    path = _path(settings, parked.report, WAITING)
    partial = path.with_suffix(".partial")
    partial.write_text(parked.model_dump_json())
    partial.replace(path)


def take(settings: Settings, report: str, retry_pass: int) -> Parked | None:
    """Take pass ``retry_pass`` of ``report`` for this run; None when it does not wait (an
    earlier run took it, or the retries ended). ValueError for a name that is no report's."""
    waiting, taken = _path(settings, report, WAITING), _path(settings, report, TAKEN)
    parked = read_parked(waiting)
    if parked is None or parked.retry_pass != retry_pass:
        return None
    try:
        waiting.rename(taken)  # (atomic: of two runs, one gets it)
    except FileNotFoundError:
        return None
    got = read_parked(taken)
    if got is None or got.retry_pass != retry_pass:  # (a later pass's, parked meanwhile)
        with contextlib.suppress(OSError):
            taken.rename(waiting)
        return None
    return got


def release(settings: Settings, report: str) -> None:
    """The pass taken by :func:`take` is over (a next pass, if any, waits in its own file)."""
    _path(settings, report, TAKEN).unlink(missing_ok=True)


def read_parked(path: Path) -> Parked | None:
    try:
        return Parked.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def waiting_passes(settings: Settings) -> Iterator[tuple[Path, Parked]]:
    for path in reports_dir(settings).glob(f"*{WAITING}"):
        parked = read_parked(path)
        if parked is not None:
            yield path, parked


def any_pass_due(settings: Settings) -> bool:
    """Whether a parked pass is due (files only: Prefect is not asked)."""
    now = datetime.now(UTC)
    return any(parked.next_retry_at <= now for _, parked in waiting_passes(settings))
