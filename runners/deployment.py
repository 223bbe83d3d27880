"""The deployment runner: the run planner (``flows/planner.py``) hands each job's run to a
work pool, and workers on any number of machines run it against the shared PostgreSQL store and
data dir (``docs/deployment.md``). The deployments are registered by ``runners/deploy.py``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

from verimail.config import Settings
from verimail.flows import planner
from verimail.jobs import reverify_parking
from verimail.jobs.context import store_for
from verimail.jobs.reverify import any_list_due
from verimail.store import job_shards
from verimail.store import jobs as job_store

log = logging.getLogger(__name__)

K = TypeVar("K")


class DeploymentRunner:
    """Hands runs to Prefect workers through the deployments of ``prefect.yaml``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def submit(
        self,
        kind: str,
        job_id: int,
        attempt: int | None = None,
        *,
        retry_pass: int = 0,
        at: datetime | None = None,
    ) -> None:
        """A flow run of the job in the work pool (``kind``: its flow's key, which the job's
        kind decides); with ``at``, a ``Scheduled`` one a worker takes at that time (no
        worker is held meanwhile)."""
        job = job_store.get_job_any(store_for(self.settings).engine, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        request = planner.job_request(
            self.settings, job, attempt=attempt, retry_pass=retry_pass, at=at
        )
        planner.submit_to_pool_now(self.settings, request)

    def submit_shard(self, job_id: int, shard: int, attempt: int) -> None:
        """A ``verify-shard`` run of a big job's shard in the work pool."""
        job = job_store.get_job_any(store_for(self.settings).engine, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        total = int((job.options or {}).get("shards", {}).get("total", 0))
        request = planner.shard_request(self.settings, job, shard, attempt, total)
        planner.submit_to_pool_now(self.settings, request)

    def held_shards(self) -> list[tuple[int, int]]:
        """Shards whose ``verify-shard`` run waits in the work pool (as :meth:`held_jobs`
        tells for jobs): queued, not dead."""
        waiting = job_shards.unfinished_flow_runs(store_for(self.settings).engine)
        return sorted(self._waiting(waiting))

    def held_jobs(self) -> list[int]:
        """Unfinished jobs whose flow run waits in the work pool: no worker has taken it
        yet (Scheduled, Late), or one took it moments ago and is starting its process
        (Pending, for at most ``STARTING_LIMIT``).

        Such a job is queued, not dead. Without this, whenever every worker is busy for
        longer than ``job_stale_after`` the reaper would "resume" queued jobs — a second
        run of each — and in the end fail them as out of attempts. A run Pending for
        longer (its worker died while starting it) or Running with a silent heartbeat
        (its worker died mid-job) is not held, so the reaper resumes it.
        """
        waiting = job_store.unfinished_flow_runs(store_for(self.settings).engine)
        return sorted(self._waiting(waiting))

    @staticmethod
    def _waiting(runs: dict[K, str]) -> list[K]:
        """The keys of ``runs`` (flow run ids) whose run still waits in the work pool."""
        if not runs:
            return []
        try:
            states = _flow_run_states(list(runs.values()))
        except Exception as exc:
            # Prefect unreachable: which runs still wait cannot be told, and a run resumed now
            # could not be submitted either (the job would fail with its refund). Hold them
            # all until Prefect answers; a run that died meanwhile is resumed after that.
            log.warning(
                "could not read flow run states from Prefect (%s): holding %d run(s)",
                exc,
                len(runs),
            )
            return list(runs)
        now = datetime.now(UTC)
        held = []
        for key, run_id in runs.items():
            state = states.get(run_id)
            if state is None:
                continue
            kind, since = state
            if kind == "SCHEDULED" or (kind == "PENDING" and now - since < STARTING_LIMIT):
                held.append(key)
        return held

    def start_due_runs(self) -> int:
        """Workers start the lists' scheduled runs and parked re-verifications' retry
        passes; this only replans a list's run that was lost (see
        :func:`~verimail.runners.sweep.replan_lost_runs`) and forgets a retry pass whose
        run was (:func:`~verimail.runners.sweep.drop_lost_runs`)."""
        from verimail.runners import sweep

        if any_list_due(self.settings):
            sweep.replan_lost_runs(self.settings)
        if reverify_parking.any_pass_due(self.settings):
            sweep.drop_lost_runs(self.settings)
        return 0

    def shutdown(self) -> None:
        return None


STARTING_LIMIT = timedelta(minutes=2)  # a worker starting a flow-run process takes seconds


def _flow_run_states(run_ids: list[str]) -> dict[str, tuple[str, datetime]]:
    """Flow run id → (state type name, when it entered that state), read from Prefect."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ids = [UUID(run_id) for run_id in run_ids]
    runs = []
    with get_client(sync_client=True) as client:
        for start in range(0, len(ids), 200):  # the server caps one page at 200 runs
            chunk = ids[start : start + 200]
            runs += client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk)), limit=len(chunk)
            )
    return {
        str(run.id): (run.state.type.name, run.state.timestamp)
        for run in runs
        if run.state is not None
    }
