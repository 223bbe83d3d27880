"""Following a job the CLI runs in this process: its progress, its retry passes, its stop.

``verimail bulk``, ``verimail find --file`` and ``verimail retry`` share this. The job's
flow runs in a worker thread (``runners/local.py``) while the main thread draws its
progress (``cli/progress.py``), and:

- **a stop** — Ctrl-C or SIGTERM, at any moment (Prefect still starting, mid-pass, waiting
  for a retry pass) — cancels the job for its owner: its settled rows go to
  ``<results>.partial.csv``, the rest is refunded (``jobs/cancel.py``), the Prefect server
  the command started is stopped, and the command exits 130 (143 on SIGTERM). SIGTERM
  used to end the command at once: no partial file, and its Prefect server left running.
- **a first pass that leaves addresses put off** (greylisting, a 421, a timeout) ends the
  command by default: the results are written with those rows ``unknown``, the job stays
  parked, and the command prints the ``verimail retry`` line that asks them again after the
  server's window, into the same file. The README's own example once sat 15 silent minutes
  on one address. ``--retry-unknowns`` waits here instead, with a countdown.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from verimail.cli.progress import JobProgress, duration, finder_counts, status_counts

console = Console(stderr=True)
PLAIN: dict[str, bool] = {"markup": False, "highlight": False, "soft_wrap": True}
"""Lines a person (or a script) reads whole: never wrapped at the terminal's width."""
CANCELLED_EXIT = 130  # (128 + SIGINT, as a shell reports a command stopped by Ctrl-C)
TERMINATED_EXIT = 143  # (128 + SIGTERM)
_stopped_by: list[int] = []  # the stop signal received, if SIGTERM (Ctrl-C raises on its own)
POLL_SECONDS = 0.2
RUNNER_KIND = {"bulk_csv": "bulk", "bulk_json": "bulk", "finder_csv": "finder"}
"""The runner's flow for each kind of job the CLI can run."""


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM (a service manager, ``kill``, a CI timeout) stops the command as Ctrl-C does:
    raised as ``KeyboardInterrupt`` in the main thread, where the command handles it."""

    def interrupt(signum: int, frame: Any) -> None:
        _stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def is_parked(job: Any, after_pass: int = 0) -> bool:
    """Whether the job waits, parked, for a deferred retry pass later than ``after_pass``
    (the pass this command runs: until it claims its pass, the job still reads parked)."""
    state = job.retry
    waiting = job.status == "processing" and state.get("phase") == "waiting_to_retry"
    return waiting and int(state.get("pass", 0)) > after_pass


def run_here(  # type: ignore[no-untyped-def]
    settings,
    store,
    kind: str,
    job_id: int,
    total: int,
    partial: Path,
    *,
    wait_retries: bool,
    retry_pass: int = 0,
    announce: Callable[[], None] | None = None,
):
    """Run the job's flow (``retry_pass``: that deferred pass) in this process with its
    progress, until it ends — or, unless ``wait_retries``, until it is parked for a later
    pass; the job row then. A stop cancels it (:func:`cancel`, ``partial``: where its
    settled rows go). ``announce`` prints the run's first lines: a stop from then on is
    this run's to handle."""
    from verimail.runners.local import LocalRunner
    from verimail.store import jobs as job_store

    runner = LocalRunner(settings)
    counts_of = finder_counts if kind == "finder" else status_counts
    told = False
    try:
        runner.submit(kind, job_id, retry_pass=retry_pass)
        if announce is not None:
            announce()
        with JobProgress(console, total, counts_of) as progress:
            while True:
                current = job_store.get_job_any(store.engine, job_id)
                assert current is not None
                parked = is_parked(current, retry_pass)
                ends = current.finished or (parked and not wait_retries)
                progress.update(current, final=ends)
                if ends:
                    break
                if parked and not told:
                    told = True
                    progress.note(waiting_notice(current))
                elif not parked:
                    told = False
                time.sleep(POLL_SECONDS)
        runner.wait()
    except KeyboardInterrupt:
        cancel(settings, store, runner, kind, job_id, partial)
    runner.shutdown()
    return current


def waiting_notice(job: Any) -> str:
    """What ``--retry-unknowns`` waits for, until when, and how to stop it."""
    state = job.retry
    at = datetime.fromisoformat(state["next_retry_at"])
    left = duration(max((at - datetime.now(UTC)).total_seconds(), 0))
    return (
        f"{state.get('waiting', 0)} address(es) put off by their servers: retry pass "
        f"{state.get('pass')} at {at:%H:%M:%S} UTC (in {left}). Ctrl-C stops here: the rows "
        "settled so far are written, the rest refunded."
    )


def cancel(settings, store, runner, kind: str, job_id: int, partial: Path) -> None:  # type: ignore[no-untyped-def]
    """A stop: record the job as cancelled by its owner, its settled rows kept in
    ``partial`` (a bulk job's in the history too), say what it was charged, and exit 130
    (``jobs/cancel.py``).

    Ends with ``os._exit``: the flow still runs in a worker thread of this process, which
    the interpreter would wait for at exit (minutes, for a job parked on a slow server);
    everything it could write is settled by then, and the job is no longer its to finish.
    The runner's shutdown stops the Prefect server this process started (waiting for one
    still starting), which Prefect's own exit hook would never do after ``os._exit``."""
    from verimail.jobs.cancel import cancel_bulk_job, cancel_finder_job

    for stop in (signal.SIGINT, signal.SIGTERM):  # (a second stop must not cut this short)
        signal.signal(stop, signal.SIG_IGN)
    console.print("stopping: keeping what was settled…", highlight=False)
    do_cancel = cancel_finder_job if kind == "finder" else cancel_bulk_job
    done = do_cancel(settings, store, job_id, partial)
    if not done.recorded:  # (it ended as the key was pressed: its page says how)
        console.print(f"job {job_id} had ended already: verimail history job {job_id}", **PLAIN)
        _exit(runner)
    settled, total, written = done.settled_rows, done.total_rows, done.partial_csv
    if kind == "finder":  # (it charges as it goes: the finds handed over, and no other)
        charged = (
            f"{done.credits_used} credit(s) charged for the {done.finds} address(es) found, "
            "in its partial results; nothing else"
            if done.finds
            else "nothing was charged"
        )
    else:
        charged = "the rest was refunded"
    console.print(f"job {job_id} cancelled after {settled} of {total} rows; {charged}.", **PLAIN)
    if written is not None:
        console.print(f"partial results ({settled} rows): {written}", **PLAIN)
    else:
        console.print("no row was settled: no partial results file", **PLAIN)
    _exit(runner)


def _exit(runner: Any) -> None:
    runner.shutdown()  # (stops the parked job's timer and this process's Prefect server)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(TERMINATED_EXIT if _stopped_by else CANCELLED_EXIT)


def wait_until(at: datetime, what: str) -> None:
    """Count down to ``at`` (a terminal: one line redrawn; elsewhere a line every
    ``PLAIN_EVERY`` s); a stop raises ``KeyboardInterrupt`` to the caller."""
    from rich.live import Live

    from verimail.cli.progress import PLAIN_EVERY

    def left() -> float:
        return (at - datetime.now(UTC)).total_seconds()

    def line() -> str:
        return f"{what} in {duration(max(left(), 0))} (Ctrl-C stops waiting)"

    if left() <= 0:
        return
    if console.is_terminal:
        with Live(line(), console=console, transient=True, auto_refresh=False) as live:
            while left() > 0:
                live.update(line(), refresh=True)
                time.sleep(min(1.0, max(left(), 0.01)))
        return
    shown = -PLAIN_EVERY
    while left() > 0:
        if time.monotonic() - shown >= PLAIN_EVERY:
            console.print(line(), **PLAIN)
            shown = time.monotonic()
        time.sleep(min(1.0, max(left(), 0.01)))
