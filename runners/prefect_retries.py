"""A run whose start (or end) Prefect's API refused is tried again, a few times with growing
waits, before its job fails (issue 47.7).

Prefect's client retries each request itself (a 503 five times, 2 to 32 s apart); a server
that is busy or restarting for longer than that made the flow engine raise before the flow's
first line ("Failed to reach API"), and the job failed on its first run with an internal
error. Here the whole start is tried again while the job is still open: the flow's own
start (``flows/job_run.py``) makes a second start of the same run pick the job up as the
first would have.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from verimail.flows.failures import prefect_api_error

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFECT_RETRY_DELAYS: tuple[float, ...] = (2.0, 10.0, 30.0)
"""Seconds waited before each new try of a run Prefect's API refused (then the job fails)."""


def retry_prefect_api_errors(
    start: Callable[[], T],
    *,
    still_wanted: Callable[[], bool],
    stopping: threading.Event,
    what: str,
) -> T:
    """``start()`` — a run, from reaching Prefect and creating its flow run to reporting
    its end — tried again after each of :data:`PREFECT_RETRY_DELAYS` when it fails with a
    Prefect API error (:func:`prefect_api_error`) while ``still_wanted()`` (its job is not
    finished: a run whose work ended has nothing to try again). Any other error, the last
    try's, or a ``stopping`` runner's, is raised as it came."""
    for delay in PREFECT_RETRY_DELAYS:
        try:
            return start()
        except Exception as exc:
            if not prefect_api_error(exc) or not still_wanted():
                raise
            log.warning("%s: Prefect's API failed (%s); trying again in %g s", what, exc, delay)
            if stopping.wait(delay):
                raise
    return start()  # (the last try: its error is the job's)
