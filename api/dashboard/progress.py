"""What the progress bar shows besides the API's job fields: an ETA and, while a job
waits to retry greylisted addresses, that phase in words.

The phase fields (``phase``, ``retry_waiting``, ``next_retry_at``) are the API's when it
has them; without them the bar shows counts and ETA only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from verimail.api.dashboard.labels import phase_label, status_label
from verimail.schemas.status_groups import groups
from verimail.store.db import utcnow
from verimail.store.jobs import Job

MIN_ELAPSED = 2.0
"""Seconds of work before an ETA is guessed (earlier rates are mostly start-up)."""


def eta_seconds(job: Job, now: datetime | None = None) -> int | None:
    """Seconds left at the rate so far, or None when unknown (not started, nothing done,
    finished, or too early to tell)."""
    if job.finished or job.processed_emails <= 0 or job.total_emails <= 0:
        return None
    started = job.started_at or job.created_at
    elapsed = ((now or utcnow()) - started).total_seconds()
    if elapsed < MIN_ELAPSED:
        return None
    left = job.total_emails - job.processed_emails
    return max(0, round(elapsed / job.processed_emails * left))


def eta_text(seconds: int | None) -> str:
    """ "about 3 min left" and the like; empty when unknown."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"about {max(seconds, 1)} s left"
    if seconds < 3600:
        return f"about {round(seconds / 60)} min left"
    return f"about {seconds // 3600} h {round(seconds % 3600 / 60)} min left"


def phase_text(view: dict[str, Any]) -> str:
    """The greylist-retry phase in words; empty when the job has none (or plain verifying)."""
    phase = view.get("phase")
    if not phase or phase == "verifying":
        return ""
    text = phase_label(phase)
    waiting = view.get("retry_waiting")
    if waiting:
        text += f": {waiting:,} address{'es' if waiting != 1 else ''}"
    when = view.get("next_retry_at")
    if phase == "waiting_to_retry" and when:
        text += f", next try at {str(when)[11:16]} UTC"
    return text


RETRY_PHASES = ("waiting_to_retry", "retrying")


def progress_fields(job: Job, view: dict[str, Any]) -> dict[str, Any]:
    """The fields the progress bar and its polling script add to the job's view: with the
    counts by status group (``schemas/status_groups.py``), which the script writes into
    the page's list, so a page open since the start shows the counts a job parked for a
    retry pass has (it showed every count 0 beside "34 of 34 verified"). No ETA while a
    retry pass waits or runs: the rate of the first pass says nothing of it (it said
    "about 1 s left" for a pass 15 minutes off)."""
    seconds = None if view.get("phase") in RETRY_PHASES else eta_seconds(job)
    return {
        "status_label": status_label(view["status"]),
        "eta_seconds": seconds,
        "eta_text": eta_text(seconds),
        "phase_text": phase_text(view),
        "shards_text": shards_text(view),
        "status_groups": {} if job.kind == "finder_csv" else groups(view),
    }


def shards_text(view: dict[str, Any]) -> str:
    """A big job spread over the workers: its shards done, in words; empty otherwise."""
    total = view.get("shards_total")
    if not total:
        return ""
    return f"shards {view.get('shards_done') or 0} of {total} done"
