"""What a failed job tells its customer: the reason when it is theirs to act on, never
internals.

A failed run's exception can hold server paths (a missing upload), SQL or a Prefect URL;
``failed_reason`` is shown on the job, in the dashboard and in the webhook, so it says only
that the failure was ours, with a reference the operator finds in the logs beside the
traceback. An upload problem (``UploadError``) is the customer's to fix and is shown whole.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING

import httpx

from verimail.files.upload_errors import UploadError

if TYPE_CHECKING:
    from prefect.states import State

log = logging.getLogger("verimail.flows")

MAX_REASON = 500


def customer_reason(job_id: int, opening: str, error: BaseException | None) -> str:
    """``opening`` ("The job stopped") plus why, fit for the customer; logs ``error``."""
    if error is None:
        return f"{opening}."
    if isinstance(error, UploadError):
        return f"{opening}: {error.detail}"[:MAX_REASON]
    reference = secrets.token_hex(4)
    log.error("job %s: %s (reference %s)", job_id, opening, reference, exc_info=error)
    _to_run_log("job %s: %s (reference %s)", job_id, opening, reference)
    return (
        f"{opening} because of an internal error (reference {reference}); the operator's "
        "logs have the details."
    )


def _to_run_log(message: str, *args: object) -> None:
    """Also into the flow run's log in Prefect, where an operator using the Prefect UI looks
    (the ``verimail.flows`` logger reaches the worker's own output only); nothing outside
    a run."""
    try:
        from prefect.logging import get_run_logger

        get_run_logger().error(message, *args)
    except Exception:  # (no run here, or Prefect's logging unavailable)
        return


def ends_the_process(error: BaseException) -> bool:
    """The run is being stopped from outside: a signal (Prefect raises ``TerminationSignal``
    in a flow-run process), Ctrl-C, a ``SystemExit`` such as Rich's on a broken stdout when
    the worker that piped it died, or the cancellation the event loop hands every task
    when one of those escapes another task. Not the job's failure: the run stops beating,
    and the reaper resumes the job on a live runner (or fails it, out of runs, with the
    refund). (A run a later run superseded is stopped by ``as_owner``, as ``Superseded``.)"""
    if isinstance(error, SystemExit | KeyboardInterrupt | asyncio.CancelledError):
        return True
    from prefect.exceptions import ExternalSignal  # (imported only by flows, when it matters)

    return isinstance(error, ExternalSignal)


def refused(sentence: str) -> State:
    """The end of a run whose input cannot be used (a form filled in wrong): a Failed state
    whose message is ``sentence``, also in the run's log, and no traceback."""
    from prefect.states import Failed

    _to_run_log("%s", sentence)
    # (The error as the state's data: a caller that runs the flow directly still gets it
    # raised, as a ValueError with the same sentence.)
    return Failed(message=sentence, data=ValueError(sentence))


TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}


def prefect_api_error(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is Prefect's API failing for a while: a
    transient answer (5xx, 408, 429) or a server that could not be reached. The flow engine
    wraps some of them (``RuntimeError("Failed to reach API …")``), hence the chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.TransportError):
            return True
        if isinstance(current, httpx.HTTPStatusError):
            return current.response.status_code in TRANSIENT_STATUSES
        current = current.__cause__ or current.__context__
    return False
