"""The progress of a job the CLI runs: rate, ETA, live counts by status, the retry phase.

A bulk job of 500 addresses sat at 329/500 for ~22 s with no hint why (greylisted hosts
waiting for their retry). The line now says how fast it goes, when it should end, what the
verdicts are so far, and when the job waits to retry.

On a terminal it is a Rich progress bar; elsewhere (a CI log, a pipe) a plain line when
something changed (at most one every :data:`PLAIN_MIN_GAP` s), one every
:data:`PLAIN_EVERY` s while nothing does, and one at the end: a pipe once got ~450 identical
lines in 15 minutes. The ETA is shown only once it can be estimated (see :class:`Rate`): a
job that had settled only its first batch once said "ETA 0:04" with minutes to go.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from verimail.schemas.status_groups import STATUSES, groups

STATUS_NAMES = STATUSES
"""The API's status names in the order every surface shows them (one definition)."""
PLAIN_EVERY = 30.0  # seconds between plain progress lines while nothing changes
PLAIN_MIN_GAP = 2.0  # ...and at least this many between lines when something does
ETA_ADVANCES = 3  # the pace is measured over this many advances before an ETA is shown
ETA_SECONDS = 5.0  # ...and over at least this long


def status_counts(job: Any) -> dict[str, int]:
    """A bulk job's counts under the API's status names, one per status group
    (``schemas/status_groups.py``: the same groups as the dashboard and the demo)."""
    return groups(job)


def finder_counts(job: Any) -> dict[str, int]:
    """A finder job's counts under the names of its API fields (``found_count``, ...)."""
    return {
        "found": job.found_count,
        "catch_all": job.catch_all_count,
        "not_found": job.invalid_count,
        "invalid_input": job.risky_count,
        "skipped_no_credits": job.unknown_count,
    }


def duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def retry_phase(fields: dict[str, Any], now: datetime | None = None) -> str | None:
    """What a job waiting on servers that put it off is doing, from its API fields
    (``phase``, ``retry_waiting``, ``next_retry_at`` of GET /api/bulk/{id}); None while it
    simply verifies, or when the job has no phase. "Put off", not "greylisted": the parked
    addresses include 421s, other 4xx and timeouts (``jobs/retries.RETRYABLE``)."""
    phase, waiting = fields.get("phase"), fields.get("retry_waiting") or 0
    if phase == "waiting_to_retry":
        text = f"waiting to retry {waiting} put off"
        next_at = fields.get("next_retry_at")
        if isinstance(next_at, datetime):
            left = (next_at - (now or datetime.now(UTC))).total_seconds()
            text += f" (next try in {duration(max(left, 0))})"
        return text
    if phase == "retrying":
        return f"retrying {waiting} put off"
    return None


@dataclass
class Rate:
    """Addresses per second since the first progress (Prefect's start-up is not work), and
    the time left at that pace."""

    started: float | None = None
    first_done: int = 0
    clock: Any = time.monotonic
    advances: int = 0  # times ``done`` went up since the first progress
    last_done: int = 0

    def update(self, done: int) -> None:
        if self.started is None and done > 0:
            self.started, self.first_done = self.clock(), done
        elif self.started is not None and done > self.last_done:
            self.advances += 1
        self.last_done = max(self.last_done, done)

    def per_second(self, done: int) -> float | None:
        if self.started is None or done == self.first_done:
            return None  # (nothing more done yet: "0.0/s" would read as stuck for good)
        elapsed = self.clock() - self.started
        return (done - self.first_done) / elapsed if elapsed >= 0.5 else None

    def eta(self, done: int, total: int) -> str | None:
        """The time left at this pace, once the pace rests on :data:`ETA_ADVANCES` advances
        over :data:`ETA_SECONDS` or more (answers come in batches, a mail server's at a
        time: one batch says nothing of the next); None before."""
        if done >= total:
            return None  # (done: nothing left to estimate)
        rate = self.per_second(done)
        if rate is None or self.started is None or self.advances < ETA_ADVANCES:
            return None
        if self.clock() - self.started < ETA_SECONDS:
            return None
        return duration((total - done) / rate)


def progress_text(
    done: int, total: int, counts: dict[str, int], rate: Rate, phase: str | None
) -> tuple[str, str]:
    """``(pace, counts)``: "12.5/s, ETA 0:31" and "valid 80, invalid 20, ..." (counts
    above zero), or the retry phase in place of the pace while a job waits on it."""
    per_second = rate.per_second(done)
    pace = f"{per_second:.1f}/s" if per_second is not None else "–/s"
    eta = rate.eta(done, total)
    pace = f"{pace}, ETA {eta}" if eta else pace
    shown = ", ".join(f"{name} {n}" for name, n in counts.items() if n) or "no results yet"
    return (phase or pace), shown


@dataclass
class JobProgress:
    """Follows a job row to the end on ``console``: call ``update(job)`` at each poll."""

    console: Console
    total: int
    counts_of: Any = status_counts
    rate: Rate = field(default_factory=Rate)
    clock: Any = time.monotonic  # (when the plain lines were printed)
    _progress: Progress | None = None
    _bar: Any = None
    _last_plain: float = -PLAIN_EVERY
    _last_facts: tuple[object, ...] = ()

    def __enter__(self) -> JobProgress:
        if self.console.is_terminal:
            self._progress = Progress(
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[pace]}"),
                TextColumn("{task.fields[counts]}"),
                console=self.console,
                transient=True,
            )
            self._progress.__enter__()
            self._bar = self._progress.add_task(
                "", total=max(self.total, 1), pace="starting…", counts=""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)

    def update(self, job: Any, final: bool = False) -> None:
        from verimail.schemas.jobs import BulkJob  # (not at the top: --help loads no pydantic)

        fields = BulkJob.of(job).model_dump()
        extra = ""
        if fields.get("shards_total"):  # (a big job spread over the workers)
            extra = f", shards {fields['shards_done']}/{fields['shards_total']}"
        self.show(job.processed_emails, self.counts_of(job), retry_phase(fields), extra, final)

    def show(
        self,
        done: int,
        counts: dict[str, int],
        phase: str | None = None,
        extra: str = "",
        final: bool = False,
    ) -> None:
        """Draw ``done`` of the total with the pace, ETA and ``counts`` (what ``update`` reads
        from a job row; ``verimail verify --file`` counts its results itself)."""
        self.rate.update(done)
        pace, counts_text = progress_text(done, self.total, counts, self.rate, phase)
        pace += extra
        facts = (done, counts_text, (phase or "").split(" (")[0])  # (not the countdown)
        self._draw(done, pace, counts_text, final, facts)

    def note(self, text: str) -> None:
        """A line above the bar (or between the plain lines): what the job waits for."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _draw(
        self, done: int, pace: str, counts: str, final: bool, facts: tuple[object, ...]
    ) -> None:
        if self._progress is not None:
            self._progress.update(self._bar, completed=done, pace=pace, counts=counts)
            return
        now = self.clock()
        since = now - self._last_plain
        changed = facts != self._last_facts
        if final or (changed and since >= PLAIN_MIN_GAP) or since >= PLAIN_EVERY:
            line = f"progress {done}/{self.total}: {pace}; {counts}"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._last_plain, self._last_facts = now, facts


def summary_table(counts: dict[str, int]) -> Table:
    """Every status of the API with its count and share, zero counts included (a list owner
    looks for "invalid 0" as much as for "valid 480")."""
    total = sum(counts.values())
    table = Table("status", "addresses", "share")
    for name, n in counts.items():
        share = f"{100 * n / total:.1f}%" if total else "–"
        table.add_row(name, str(n), share)
    table.add_row("total", str(total), "", style="bold")
    return table
