"""The warm worker (``verimail worker``, issue 33.2): one long-running process that imports
verimail's flows once and runs the flow runs it claims from the work pool in its own threads,
each on an event loop of its own — as the local runner runs the planned runs it claims
(``runners/local.py`` ``_run_flow_run``).

Prefect's ``process`` worker starts a new Python process per flow run, which imports Prefect
and the flows before the flow begins (13–15 s of a 24 s start on a loaded 2-core machine,
BENCHMARKS.md "Job start"); here a run begins within the poll interval and a round trip.

What it takes: only flow runs of verimail's deployments (``schemas/flows.py``);
a run of any other deployment in the pool is left for other workers. Claiming a run moves
it to Pending, which Prefect grants once, so several warm workers (and process workers) on
one pool never run one flow run twice. It claims no more runs than it has free threads, and
of several runs due at once (a sharded job's shards) only its share among the pool's live
workers per poll, so the shards of one job spread over the workers.

What it trades (docs/deployment.md "A warm worker"): the runs share one process, so a crash
or a memory blow-up takes them all (their jobs' heartbeats stop, and the reaper resumes
them); a run cancelled in the Prefect UI is not killed mid-way (it runs to its end).
On SIGTERM or Ctrl-C it stops claiming and lets the runs it has end; a second signal ends
the process at once, leaving those runs' jobs to the reaper (``jobs/recovery.py``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from verimail.config import Settings
from verimail.flows import planner
from verimail.schemas.flows import FLOWS as REGISTERED

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0  # the worker's heartbeat to Prefect (the UI shows it Online)
FLOWS = {entry.deployment: entry.key for entry in REGISTERED}
"""Deployment name → the flow's key: the runs this worker takes."""


class PoolNotFound(RuntimeError):
    """The work pool does not exist on the Prefect server (``verimail deploy`` makes it)."""


def load_flows() -> dict[str, Any]:
    """Deployment name → flow object, every flow module imported now (the point of a warm
    worker: a run pays for no import)."""
    return {name: planner.load_flow(key) for name, key in FLOWS.items()}


class WarmWorker:
    """Polls ``pool`` every ``poll`` seconds and runs up to ``limit`` flow runs at once."""

    def __init__(
        self,
        settings: Settings,
        pool: str,
        *,
        limit: int = 4,
        poll: float = 2.0,
        name: str | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.limit = limit
        self.poll = poll
        self.name = name or f"verimail-warm-{socket.gethostname()}-{os.getpid()}"
        self.flows = load_flows()
        self._deployments: dict[UUID, str] = {}  # deployment id → name, of ours only
        self._threads = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="verimail-run")
        self._running: set[UUID] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ended = threading.Event()  # a run ended
        self._foreign: set[UUID] = set()  # other deployments' ids: not asked about again
        self.started = 0  # flow runs claimed and handed to a thread, in all

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once the runs it has have ended."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def running(self) -> list[UUID]:
        with self._lock:
            return sorted(self._running)

    def run(self) -> None:
        """Heartbeat, poll, claim and run until :meth:`stop` and the last run's end."""
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        with get_client(sync_client=True) as client:
            try:
                client.read_work_pool(self.pool)
            except ObjectNotFound:
                raise PoolNotFound(self.pool) from None
            done = threading.Event()
            beats = threading.Thread(
                target=self._beat, args=(done,), name="verimail-worker-heartbeat", daemon=True
            )
            beats.start()
            try:
                self._loop(client)
            finally:
                done.set()
        self._threads.shutdown(wait=True)

    def _loop(self, client: Any) -> None:
        while True:
            if not self.stopping:
                try:
                    self.poll_once(client)
                except Exception as exc:  # (Prefect unreachable a moment: try again)
                    log.warning("polling work pool %s failed: %r", self.pool, exc)
                self._stopping.wait(self.poll)
            elif not self.running():
                return
            else:  # (stopping: wait for the runs it has to end, beating meanwhile)
                self._ended.wait(self.poll)
                self._ended.clear()

    def _beat(self, done: threading.Event) -> None:
        """Worker heartbeats, on a thread of their own: a heartbeat Prefect is slow to answer
        (its client retries a 503 for a minute) must not hold up the polls."""
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not done.is_set():
                try:
                    client.send_worker_heartbeat(
                        self.pool, self.name, heartbeat_interval_seconds=HEARTBEAT_SECONDS
                    )
                except Exception as exc:
                    log.warning("worker heartbeat failed: %r", exc)
                done.wait(HEARTBEAT_SECONDS)

    def poll_once(self, client: Any) -> int:
        """Claim this worker's share of the pool's due runs of our deployments (no more than
        it has free threads) and start each in a thread; returns how many. The pool is asked
        even when every thread is busy: Prefect counts a poll as the deployments' sign of
        life ("Ready")."""
        due = client.get_scheduled_flow_runs_for_work_pool(
            self.pool, scheduled_before=datetime.now(UTC)
        )
        ours = []
        for response in due:
            name = self._deployment_name(client, response.flow_run.deployment_id)
            if name is not None:  # (else another deployment's run: another worker's)
                ours.append((response.flow_run, name))
        share = min(self.limit - len(self.running()), self._fair_share(client, len(ours)))
        started = 0
        for run, name in ours:
            if started >= share:
                break
            claimed = self._claim(client, run.id)
            if claimed is None:
                continue  # (another worker claimed it first)
            log.info("flow run %s (%s) claimed", claimed.id, name)
            with self._lock:
                self._running.add(claimed.id)
            self._threads.submit(self._run_flow_run, FLOWS[name], claimed)
            self.started += 1
            started += 1
        return started

    def _fair_share(self, client: Any, due: int) -> int:
        """How many of ``due`` runs this poll may claim: an even share among the pool's live
        workers (rounded up). Several due at once are a sharded job's shards, and claimed
        all by the first worker to poll they would queue on its threads (and share its one
        interpreter) while the other workers idled; a worker alone takes them all."""
        if due <= 1:
            return due
        return math.ceil(due / self._live_workers(client))

    def _live_workers(self, client: Any) -> int:
        """The pool's workers whose heartbeat is recent (this one counted in any case; a
        worker gone missing is counted until it misses two heartbeats, and only slows the
        others' claims by a poll)."""
        try:
            workers = client.read_workers_for_work_pool(self.pool)
        except Exception as exc:  # (Prefect slow to answer: claim as if alone)
            log.warning("reading the workers of pool %s failed: %r", self.pool, exc)
            return 1
        now = datetime.now(UTC)
        alive = {self.name}
        for worker in workers:
            every = worker.heartbeat_interval_seconds or HEARTBEAT_SECONDS
            seen = worker.last_heartbeat_time
            if seen is not None and now - seen <= timedelta(seconds=2 * every + HEARTBEAT_SECONDS):
                alive.add(worker.name)
        return len(alive)

    def _claim(self, client: Any, run_id: UUID) -> Any:
        """Move the run to Pending for this worker; the run if it is ours now, else None.

        Prefect grants Pending once. The proposal names this claim, so an answer that did not
        come back (a timeout, or the client's retry of it answered "already Pending" — seen
        with a Prefect server on SQLite under load, its answer a minute late) is settled by
        reading the run: Pending under this claim's name is ours."""
        from prefect.client.schemas.responses import SetStateStatus
        from prefect.states import Pending

        mark = f"claimed by {self.name} ({uuid4().hex[:12]})"
        try:
            if client.set_flow_run_state(run_id, Pending(message=mark)).status == (
                SetStateStatus.ACCEPT
            ):
                return client.read_flow_run(run_id)
        except Exception as exc:
            log.warning("claiming flow run %s: %r; reading it back", run_id, exc)
        run = client.read_flow_run(run_id)
        state = run.state
        if state is not None and state.is_pending() and state.message == mark:
            return run
        return None

    def _deployment_name(self, client: Any, deployment_id: UUID | None) -> str | None:
        """The name of one of our deployments with this id, else None. Ours are looked up by
        name, again whenever an unknown id comes (deployments registered after the start,
        or registered anew)."""
        if deployment_id is None or deployment_id in self._foreign:
            return None
        if deployment_id not in self._deployments:
            from prefect.exceptions import ObjectNotFound

            for name in FLOWS:
                try:
                    self._deployments[client.read_deployment_by_name(name).id] = name
                except ObjectNotFound:
                    continue
            if deployment_id not in self._deployments:
                self._foreign.add(deployment_id)
        return self._deployments.get(deployment_id)

    def _run_flow_run(self, key: str, flow_run: Any) -> None:
        """Run a claimed flow run of the flow ``key`` to its end on this thread's own event
        loop (the flow reports its own failures to Prefect and to its job, and hands the
        runs that follow it to the pool itself)."""
        try:
            planner.run_claimed(self.settings, key, flow_run)
        except BaseException as exc:
            log.warning("flow run %s ended with %r", flow_run.id, exc)
        else:
            log.info("flow run %s ended", flow_run.id)
        finally:
            _settle_cancelling(flow_run.id)
            with self._lock:
                self._running.discard(flow_run.id)
            self._ended.set()


CANCELLED_LATE = (
    "Cancelled in Prefect while it ran: the warm worker does not stop a run mid-way (no process "
    "of its own to kill); it ran to its end. Stop a job in verimail to stop it mid-way."
)


def _settle_cancelling(run_id: UUID) -> None:
    """A run cancelled in the Prefect UI while it ran ends as Cancelled, not left Cancelling
    for ever (Prefect refuses its flow's own final state then; the process worker would have
    killed its process and marked it so)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_cancelling():
                client.set_flow_run_state(run_id, Cancelled(message=CANCELLED_LATE))
    except Exception as exc:
        log.warning("could not settle cancelled flow run %s: %r", run_id, exc)
