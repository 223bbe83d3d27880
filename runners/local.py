"""The local runner: the API process (or the CLI) runs the flows itself, in a small thread
pool, on Prefect's embedded server — nothing else to install or start. The first flow run
of a process waits for that server (≈ 10–20 s), so the API warms it up in the background at
start-up instead of making start-up slow.

A job never stays ``pending``/``processing`` because its run never started or died early:
the runner checks the job after the flow returns, and ``jobs/recovery.py`` reaps jobs whose
heartbeat stopped. With this runner the process is also the worker of the planned
``reverify-stored`` runs (``runners/sweep.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from verimail.config import Settings
from verimail.flows import planner
from verimail.flows.failures import customer_reason, ends_the_process
from verimail.jobs import reverify_parking
from verimail.jobs.context import store_for
from verimail.jobs.heartbeat import was_superseded
from verimail.jobs.notify import notify_job_soon
from verimail.jobs.reverify import any_list_due
from verimail.runners.prefect_retries import retry_prefect_api_errors
from verimail.store import jobs as job_store

log = logging.getLogger(__name__)


WARM_UP_JOIN_SECONDS = 60.0  # the most a shutdown waits for the Prefect warm-up


class LocalRunner:
    """Runs flows in this process, in background threads, on Prefect's embedded server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool = ThreadPoolExecutor(
            max_workers=settings.local_runner_workers, thread_name_prefix="verimail-job"
        )
        self._futures: set[Future[None]] = set()
        self._jobs: set[int] = set()  # submitted and not yet returned: queued or running
        self._shards: set[tuple[int, int]] = set()  # (job, shard) run on their own, likewise
        self._keys: set[str] = set()  # runs queued, running or on a timer here (one per key)
        self._lock = threading.Lock()
        self._prefect_lock = threading.Lock()
        self._prefect_ready = False
        self._warm_up: threading.Thread | None = None
        self._timers: list[threading.Timer] = []  # parked jobs' next passes
        self._closed = False
        self._stopping = threading.Event()  # (ends a wait to try a run again)

    def warm_up(self) -> threading.Thread:
        """Import Prefect and start its embedded server in a background thread."""
        thread = threading.Thread(
            target=self._warm_up_prefect, name="verimail-prefect-warm-up", daemon=True
        )
        thread.start()
        self._warm_up = thread
        return thread

    def _warm_up_prefect(self) -> None:
        try:
            self._ensure_prefect()
        except Exception:  # (the first run tries again, and reports what is wrong)
            log.exception("reaching the Prefect API failed")

    def _ensure_prefect(self) -> None:
        """Reach the Prefect API once, starting the embedded server if none is configured;
        raises if it cannot be reached (a run then fails instead of starting a server of its
        own: see :func:`_start_embedded_prefect`).

        Serialised: Prefect's embedded server is not safe to start from two threads at
        once (both pick the same port), so the warm-up and the first job runs take turns.
        """
        with self._prefect_lock:
            if self._prefect_ready:
                return
            if self._closed:  # (a server started now would outlive the shutdown's stop)
                raise RuntimeError("the runner is shut down")
            _start_embedded_prefect()
            from prefect.client.orchestration import get_client

            async def hello() -> None:
                async with get_client() as client:
                    await client.hello()

            asyncio.run(hello())
            self._prefect_ready = True

    def prefect_ready(self) -> None:
        """Make sure Prefect answers before asking it something from another thread."""
        self._ensure_prefect()

    def submit(
        self,
        kind: str,
        job_id: int,
        attempt: int | None = None,
        *,
        retry_pass: int = 0,
        at: datetime | None = None,
    ) -> None:
        """Run the job's flow (``kind``: its key, which the job's kind decides) here; with
        ``retry_pass``/``at``, that deferred pass at that time."""
        job = self._job(job_id)
        self.execute(
            planner.job_request(self.settings, job, attempt=attempt, retry_pass=retry_pass, at=at)
        )

    def submit_shard(self, job_id: int, shard: int, attempt: int) -> None:
        """Run a shard of a big job on its own (the reaper's: its earlier run died); the
        run that finishes the job's last shard asks for the job's merge, run here too."""
        job = self._job(job_id)
        total = int((job.options or {}).get("shards", {}).get("total", 0))
        self.execute(planner.shard_request(self.settings, job, shard, attempt, total))

    def _job(self, job_id: int) -> job_store.Job:
        job = job_store.get_job_any(store_for(self.settings).engine, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        return job

    def execute(self, request: planner.RunRequest) -> None:
        """Run ``request`` in a worker thread of this process, at ``request.at`` (a timer, not
        a thread, holds it until then: a restart loses the timer, and the reaper starts the
        pass once it is due). A request whose key is queued, running or waiting on a timer
        here already is the same run: it is dropped."""
        if self._closed:  # (a parked job's timer after shutdown: the reaper has it)
            return
        with self._lock:
            if request.key in self._keys:
                return
            self._keys.add(request.key)
        delay = (request.at - datetime.now(UTC)).total_seconds() if request.at else 0.0
        if delay > 0:
            timer = threading.Timer(delay, self._start, (request,))
            timer.daemon = True
            with self._lock:
                self._timers = [t for t in self._timers if t.is_alive()] + [timer]
            timer.start()
            return
        self._start(request)

    def _start(self, request: planner.RunRequest) -> None:
        if self._closed:
            return
        with self._lock:
            if request.shard is not None:
                self._shards.add((request.job_id, request.shard))
            elif request.job_id is not None:
                self._jobs.add(request.job_id)
        future = self._pool.submit(self._run, request)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)

    def held_jobs(self) -> list[int]:
        """Jobs this process holds (queued for a worker thread or running).

        The reaper beats their heartbeats: a job waiting its turn here, or whose flow run
        is still starting, is alive and must not be "resumed" a second time.
        """
        with self._lock:
            return sorted(self._jobs)

    def held_shards(self) -> list[tuple[int, int]]:
        """Shards this process holds (queued for a worker thread or running)."""
        with self._lock:
            return sorted(self._shards)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def _run(self, request: planner.RunRequest) -> None:
        error: BaseException | None = None
        outcome: Any = None
        try:
            outcome = retry_prefect_api_errors(
                lambda: self._run_here(request),
                still_wanted=lambda: _unfinished(self.settings, request.job_id),
                stopping=self._stopping,
                what=request.name,
            )
        except BaseException as exc:  # the flow has marked the job failed if it got that far
            error = exc
            log.warning("%s ended with %r", request.name, exc)
        finally:
            if request.shard is None and request.job_id is not None:
                self._settle(request, outcome, error)
            with self._lock:
                self._jobs.discard(request.job_id)  # type: ignore[arg-type]
                self._shards.discard((request.job_id, request.shard))  # type: ignore[arg-type]
                self._keys.discard(request.key)
        for next_run in _next_runs(outcome):
            self.execute(next_run)

    def _run_here(self, request: planner.RunRequest) -> Any:
        self._ensure_prefect()
        return planner.run_here(self.settings, request)

    def _settle(
        self, request: planner.RunRequest, outcome: Any, error: BaseException | None
    ) -> None:
        """A job run that returned must not leave its job open — unless a later run has it,
        it was stopped from outside (the reaper resumes the job: see ends_the_process), it
        is parked for a deferred pass, or its shards run on (the reaper's and the last
        shard's to end)."""
        stopped = error is not None and ends_the_process(error)
        status = outcome.get("status") if isinstance(outcome, dict) else None
        if was_superseded(outcome) or stopped or status in ("waiting_to_retry", "sharded"):
            return
        _fail_if_unfinished(
            self.settings,
            request.job_id,
            error,
            request.parameters.get("attempt"),  # type: ignore[arg-type]
        )

    def start_due_runs(self) -> int:
        """Claim the planned ``reverify-stored`` runs that are due — lists' scheduled runs
        and parked re-verifications' retry passes (``flows/planned_runs.py``) — and run them
        here: with the local runner, this process is their worker. Called by the reaper's
        sweep; Prefect is asked only when the store or a parked pass's file says one is
        due."""
        from verimail.runners import sweep

        schedules = any_list_due(self.settings)
        passes = reverify_parking.any_pass_due(self.settings)
        if not (schedules or passes):
            return 0
        self._ensure_prefect()
        planned = ((planner.LIST_RUN_TAG, schedules), (planner.RETRY_RUN_TAG, passes))
        tags = [tag for tag, due in planned if due]
        runs = sweep.claim_due_runs(self.settings, tags)
        for run in runs:
            future = self._pool.submit(self._run_flow_run, run)
            with self._lock:
                self._futures.add(future)
            future.add_done_callback(self._forget)
        if schedules:
            sweep.replan_lost_runs(self.settings)
        if passes:
            sweep.drop_lost_runs(self.settings)
        return len(runs)

    def _run_flow_run(self, flow_run: Any) -> None:
        """Run a claimed flow run of ``reverify-stored`` (it reports its own failures) and
        the runs it says come next (a list's job's deferred retry pass)."""
        try:
            outcome = planner.run_claimed(self.settings, "reverify", flow_run)
        except BaseException as exc:
            log.warning("scheduled run %s ended with %r", flow_run.id, exc)
            return
        for next_run in _next_runs(outcome):
            self.execute(next_run)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every submitted run (tests, shutdown)."""
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.result(timeout=timeout)

    def shutdown(self) -> None:
        self._closed = True
        self._stopping.set()
        with self._lock:
            for timer in self._timers:
                timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        # A process that ends while the warm-up is still starting Prefect kills that
        # thread inside native code at interpreter exit, which aborts the process
        # ("FATAL: exception not rethrown", seen with `verimail demo --once`): let it end.
        if self._warm_up is not None:
            self._warm_up.join(WARM_UP_JOIN_SECONDS)
        # A run's own start of the server (`verimail bulk` stopped while Prefect starts) is
        # let end too, then stopped: stopped half-way, uvicorn kept running after the CLI.
        if self._prefect_lock.acquire(timeout=EMBEDDED_START_SECONDS):
            self._prefect_lock.release()
        _stop_embedded_prefect()


def _next_runs(outcome: Any) -> list[planner.RunRequest]:
    """The runs a flow's outcome says come next (``flows/planner.py``)."""
    return (outcome.get("next_runs") or []) if isinstance(outcome, dict) else []


EMBEDDED_START_SECONDS = 120
"""How long the embedded server may take to start unless
``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` says otherwise (Prefect's own default, 20 s,
was too short for a first start on a busy machine)."""
EMBEDDED_START_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def _start_embedded_prefect() -> None:
    """Start Prefect's embedded server for this process (no ``PREFECT_API_URL``), or raise.

    A first start in a new ``PREFECT_HOME`` builds Prefect's database, which took longer than
    Prefect's 20 s on a busy CI machine. Prefect then left that server running, unowned, and
    started a second one on the next request; the first kept `verimail bulk`'s output open
    after the command had ended, and the script waiting for it hung. Here a start gets
    ``EMBEDDED_START_SECONDS`` (or the Prefect setting, where the environment sets it) and a
    start that misses its deadline is stopped before the error is raised."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    )

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return  # (a server of the deployment; or none, which Prefect reports itself)
    from prefect.server.api.server import SubprocessASGIServer

    deadline = EMBEDDED_START_SECONDS
    if EMBEDDED_START_SETTING in os.environ:
        deadline = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    server = SubprocessASGIServer()
    try:
        server.start(timeout=deadline)
    except BaseException as exc:
        server.stop()
        raise RuntimeError(
            f"Prefect's embedded server did not start within {deadline} s ({exc}); "
            f"{EMBEDDED_START_SETTING} sets how long it may take, PREFECT_API_URL names a "
            "Prefect server to use instead"
        ) from exc


def _stop_embedded_prefect() -> None:
    """Stop the Prefect server this process started for itself (no ``PREFECT_API_URL``).

    Prefect stops it from an ``atexit`` hook, which never runs when the process ends on
    SIGTERM (uvicorn re-raises the signal after its shutdown): every restart of ``verimail
    serve`` left one more server process running. A server named by ``PREFECT_API_URL``
    (a Prefect server of the deployment, a test harness) is not this process's to stop."""
    if "prefect" not in sys.modules:
        return  # (no job ran and no warm-up: no server was started)
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    send_pending_logs()
    SubprocessASGIServer().stop()


LOG_DRAIN_SECONDS = 10.0  # the most a stop waits to hand Prefect its last log lines


def send_pending_logs() -> None:
    """Send the runs' last log lines to the server before it stops. Left queued, Prefect's
    log worker sends them at exit, to a server that is gone, retrying for a minute before
    it prints "Error logging to API" (`verimail bulk` hung that long after its results).
    On a thread of its own: Prefect drains synchronously only outside an event loop, and a
    stop may come from one (uvicorn's shutdown)."""
    from prefect.logging.handlers import APILogWorker

    drain = threading.Thread(
        target=APILogWorker.drain_all, kwargs={"timeout": LOG_DRAIN_SECONDS}, daemon=True
    )
    drain.start()
    drain.join(LOG_DRAIN_SECONDS + 1)


def _unfinished(settings: Settings, job_id: int | None) -> bool:
    """Whether the job is still open (a run that failed to start may be tried again)."""
    if job_id is None:
        return True
    job = job_store.get_job_any(store_for(settings).engine, job_id)
    return job is not None and not job.finished


def _fail_if_unfinished(
    settings: Settings, job_id: int, error: BaseException | None, attempt: int | None = None
) -> None:
    """A run that returned (or crashed before its first line) must not leave the job open —
    unless a later run has it (``attempt`` is not the job's run any more)."""
    try:
        store = store_for(settings)
        job = job_store.get_job_any(store.engine, job_id)
        if job is None or job.finished:
            return
        if job_store.mark_failed(
            store.engine,
            job_id,
            customer_reason(job_id, "The job's run ended without finishing", error),
            job_store.UNVERIFIED,
            attempt=attempt,
        ):
            notify_job_soon(settings, job_id)
    except Exception:
        log.exception("could not settle job %s", job_id)
