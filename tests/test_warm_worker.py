"""The warm worker (`verimail worker`, issue 33.2) for real: deployments on a Prefect server,
`verimail worker` processes on the pool, the API handing bulk jobs to them with
`run_deployment`, the store on PostgreSQL — as `test_deployment_mode.py` runs Prefect's
process worker.

- A job submitted through the API completes on a warm worker with the right results, and a
  flow run of another deployment in the same pool is left where it was (Scheduled).
- Two warm workers on one pool take several jobs between them and run each flow run once:
  one Running state per run, each address asked once, each job on its first attempt.
- SIGTERM stops a worker cleanly (exit 0).
- A run cancelled in the Prefect UI is not stopped mid-way: its job completes, and the flow
  run ends Cancelled rather than staying Cancelling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from api_helpers import PATIENCE, api_world, env_for_testbed, poll_job, running_app

from verimail.runners.testing import warm_worker, worker_env
from verimail.store import jobs as job_store
from verimail.store.testing import temporary_database_url
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]


def _pool() -> str:
    return f"verimail-warm-{os.getpid()}"


async def _register(pool: str) -> None:
    from verimail.runners.deploy import register_deployments

    assert await asyncio.to_thread(register_deployments, pool, schedule=False)


def _env(tb: Testbed, url: str, data: Path) -> dict[str, str]:
    return worker_env(env_for_testbed(tb), database_url=url, data_dir=data)


def _foreign_run(pool: str) -> UUID:
    """A flow run of a deployment that is not verimail's, in ``pool``, due now."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("someone-else")
        deployment = client.create_deployment(
            flow_id, "someone-else", work_pool_name=pool, entrypoint="elsewhere.py:flow"
        )
        return client.create_flow_run_from_deployment(deployment).id


def _state_types(run_id: UUID, *, final: bool = False, timeout: float = PATIENCE) -> list[str]:
    """The run's state types, oldest first; with ``final``, once it is in a final state (the
    job is completed by the flow a moment before the flow run itself ends)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            states = client.read_flow_run_states(run_id)
            types = [s.type.value for s in sorted(states, key=lambda s: s.timestamp)]
            if not final or types[-1] in FINAL or time.monotonic() > deadline:
                return types
            time.sleep(0.1)  # (polling Prefect: nothing to wait on but its answer)


FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _online_and_ready(pool: str, timeout: float = PATIENCE) -> tuple[bool, set[str]]:
    """Whether a worker of ``pool`` is Online, and the statuses of our four deployments,
    once both are as the warm worker's heartbeats and polls make them (Prefect marks the
    deployments Ready in a background task of its own, a moment after a poll)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from verimail.runners.worker import worker_online
    from verimail.schemas.flows import DEPLOYMENTS

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            deployments = [client.read_deployment_by_name(n) for n in DEPLOYMENTS.values()]
            ready = {str(getattr(d.status, "value", d.status)) for d in deployments}
            online = worker_online(str(PREFECT_API_URL.value()), pool)
            if (online and ready == {"READY"}) or time.monotonic() > deadline:
                return online, ready
            time.sleep(0.2)  # (polling Prefect: nothing to wait on but its answer)


def _log(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


async def test_a_job_runs_on_the_warm_worker_and_other_runs_are_left(
    testbed_factory, testbed_settings, tmp_path
):
    tb = testbed_factory(api_world())
    pool = _pool()
    log = tmp_path / "warm.log"
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        foreign = await asyncio.to_thread(_foreign_run, pool)
        with warm_worker(pool, _env(tb, url, tmp_path), log) as worker:
            async with running_app(settings) as app:
                customer = app.customer(credits=50)
                created = await app.client.post(
                    "/api/verify/bulk",
                    headers=customer.headers,
                    json={"emails": ["alice@acme.test", "nobody@acme.test"]},
                )
                assert created.status_code == 200, created.text
                job_id = created.json()["job_id"]
                done = await poll_job(app.client, f"/api/verify/bulk/{job_id}", customer.headers)
                job = job_store.get_job_any(app.store.engine, int(job_id))
            assert done["status"] == "completed", (done, _log(log))
            assert [r["status"] for r in done["results"]] == ["valid", "invalid"]
            assert job is not None and job.flow_run_id
            states = await asyncio.to_thread(_state_types, UUID(job.flow_run_id), final=True)
            assert states.count("RUNNING") == 1 and states[-1] == "COMPLETED", states
            # The other deployment's run was due all along: the worker polled past it.
            assert await asyncio.to_thread(_state_types, foreign) == ["SCHEDULED"]
            # Its heartbeats and polls: the worker Online, the deployments Ready in the UI.
            assert await asyncio.to_thread(_online_and_ready, pool) == (True, {"READY"})
            worker.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(worker.wait, 60) == 0, _log(log)
        assert "stopped (1 run(s) taken)" in _log(log)


async def test_two_warm_workers_run_each_flow_run_once(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    pool = _pool()
    jobs = 6
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        env = _env(tb, url, tmp_path)
        logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
        with warm_worker(pool, env, logs[0]), warm_worker(pool, env, logs[1]):
            async with running_app(settings) as app:
                customer = app.customer(credits=50)
                ids = []
                for n in range(jobs):  # one address each, each its own mailbox
                    created = await app.client.post(
                        "/api/verify/bulk",
                        headers=customer.headers,
                        json={"emails": [f"user{n}@acme.test"]},
                    )
                    assert created.status_code == 200, created.text
                    ids.append(int(created.json()["job_id"]))
                done = [
                    await poll_job(app.client, f"/api/verify/bulk/{i}", customer.headers)
                    for i in ids
                ]
                rows = [job_store.get_job_any(app.store.engine, i) for i in ids]
            both = "".join(_log(p) for p in logs)
            assert all(d["status"] == "completed" for d in done), (done, both)
            for job in rows:
                assert job is not None and (job.options or {}).get("attempts", 1) == 1
                run_id = UUID(str(job.flow_run_id))
                states = await asyncio.to_thread(_state_types, run_id, final=True)
                assert states.count("PENDING") == 1 and states.count("RUNNING") == 1, states
                assert states[-1] == "COMPLETED", states
        asked = [a for a in tb.host_stats("mx.acme.test").rcpts if not a.startswith("vm-probe-")]
        assert sorted(asked) == sorted(f"user{n}@acme.test" for n in range(jobs))  # each once


SLOW_HOST = "mx.tortoise.test"


def _slow_world(rows: int) -> World:
    mailboxes = {f"user{i}" for i in range(0, rows, 2)}
    return World.of(
        [HostSpec(SLOW_HOST, HostBehaviour(mailboxes=mailboxes, reply_delay=0.1))],
        [DomainSpec("tortoise.test", mx=[(10, SLOW_HOST)])],
    )


def _cancel(run_id: UUID) -> None:
    """What the Prefect UI's "Cancel" does: the run to Cancelling."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelling())


ROWS = 24


@contextlib.asynccontextmanager
async def _slow_job_on_a_warm_worker(
    testbed_factory, testbed_settings, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any, str, Any, Path]]:
    """A warm worker on a fresh pool running a bulk job of :data:`ROWS` addresses on a slow
    host, already talking to it: (app, customer, the job's URL, the worker, its log)."""
    tb = testbed_factory(_slow_world(ROWS))
    pool = _pool()
    log = tmp_path / "warm.log"
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        with warm_worker(pool, _env(tb, url, tmp_path), log) as worker:
            async with running_app(settings) as app:
                customer = app.customer(credits=100)
                emails = [f"user{i}@tortoise.test" for i in range(ROWS)]
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                url_of_job = f"/api/verify/bulk/{created.json()['job_id']}"
                reached = await asyncio.to_thread(
                    tb.wait_until, lambda t: t.host_stats(SLOW_HOST).active >= 1
                )
                assert reached, _log(log)
                yield app, customer, url_of_job, worker, log


async def test_a_run_cancelled_in_prefect_is_not_killed_mid_way(
    testbed_factory, testbed_settings, tmp_path
):
    async with _slow_job_on_a_warm_worker(testbed_factory, testbed_settings, tmp_path) as (
        app,
        customer,
        url,
        _worker,
        log,
    ):
        job = job_store.get_job_any(app.store.engine, int(url.rsplit("/", 1)[1]))
        assert job is not None
        run_id = UUID(str(job.flow_run_id))
        await asyncio.to_thread(_cancel, run_id)
        done = await poll_job(app.client, url, customer.headers)
        states = await asyncio.to_thread(_state_types, run_id, final=True)
    # Not killed mid-way: the job ran to its end (every row, charged as usual), and the
    # flow run ended Cancelled (not left Cancelling), saying why.
    assert done["status"] == "completed", (done, _log(log))
    assert done["processed_emails"] == ROWS
    assert states[-2:] == ["CANCELLING", "CANCELLED"], (states, _log(log))


async def test_sigterm_lets_the_running_job_end(testbed_factory, testbed_settings, tmp_path):
    """SIGTERM mid-job: the worker claims nothing more, the job it runs ends on its first
    run (the reaper never had to resume it), then the worker exits 0."""
    async with _slow_job_on_a_warm_worker(testbed_factory, testbed_settings, tmp_path) as (
        app,
        customer,
        url,
        worker,
        log,
    ):
        worker.send_signal(signal.SIGTERM)
        done = await poll_job(app.client, url, customer.headers)
        job = job_store.get_job_any(app.store.engine, int(url.rsplit("/", 1)[1]))
        assert await asyncio.to_thread(worker.wait, 60) == 0, _log(log)
    assert done["status"] == "completed", (done, _log(log))
    assert done["processed_emails"] == ROWS
    assert job is not None and (job.options or {}).get("attempts", 1) == 1
    assert "waiting for 1 run(s) to end" in _log(log)
    assert "stopped (1 run(s) taken)" in _log(log)


async def test_runs_due_together_are_shared_among_the_live_workers(tmp_path):
    """Issue 43.2: of three runs due at once (a job's shards), a warm worker with threads to
    spare claims two when another worker of the pool beats a heartbeat (the rest are the
    other's), and all three when it is alone. The runs are claimed from Prefect for real;
    only their running is left out (they are recorded, not started)."""
    from prefect.client.orchestration import get_client

    from verimail.config import Settings
    from verimail.runners.warm_worker import WarmWorker
    from verimail.schemas.flows import DEPLOYMENTS

    def claimed(pool: str, other_worker: bool) -> tuple[int, list[str]]:
        from verimail.runners.deploy import register_deployments

        register_deployments(pool, schedule=False)  # (the deployments move to this pool)
        with get_client(sync_client=True) as client:
            if other_worker:
                client.send_worker_heartbeat(pool, "another-machine", heartbeat_interval_seconds=10)
            deployment = client.read_deployment_by_name(DEPLOYMENTS["shard"])
            made = [
                client.create_flow_run_from_deployment(
                    deployment.id, parameters={"job_id": 10**9, "shard": shard, "attempt": 1}
                ).id
                for shard in range(3)
            ]
            worker = WarmWorker(Settings(data_dir=tmp_path), pool, limit=4, poll=60)
            started: list[Any] = []
            worker._threads.submit = lambda fn, key, run: started.append(run)  # type: ignore[method-assign,assignment]
            count = worker.poll_once(client)
            worker._threads.shutdown()
            states = [client.read_flow_run(i).state.type.value for i in made]  # type: ignore[union-attr]
        assert len(started) == count
        return count, sorted(states)

    shared, alone = f"{_pool()}-shared", f"{_pool()}-alone"
    assert await asyncio.to_thread(claimed, shared, True) == (
        2,
        ["PENDING", "PENDING", "SCHEDULED"],
    )
    assert await asyncio.to_thread(claimed, alone, False) == (3, ["PENDING"] * 3)


async def test_the_documented_worker_stops_on_the_first_sigterm(tmp_path: Path) -> None:
    """``verimail worker`` as docs/deployment.md writes it, idle on a pool: one SIGTERM and
    it ends (exit 0), as systemd's stop expects (issue 43.3: an idle ``prefect worker
    start`` ignored the first)."""
    from prefect.settings import PREFECT_API_URL

    from verimail.runners.deploy import register_deployments
    from verimail.runners.worker import worker_online

    pool = f"verimail-sigterm-{os.getpid()}"
    assert await asyncio.to_thread(register_deployments, pool, schedule=False)
    env = worker_env(
        {"VERIMAIL_PREFECT_WORK_POOL": pool},
        database_url=f"sqlite:///{tmp_path / 'verimail.db'}",
        data_dir=tmp_path,
    )
    log = tmp_path / "worker.log"
    api = str(PREFECT_API_URL.value())
    with warm_worker(None, env, log, limit=None, poll=None) as worker:
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(worker_online, api, pool):
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.2)  # (a process starting: nothing to await but its heartbeat)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 60) == 0, log.read_text()
    assert "stopped (0 run(s) taken)" in log.read_text()
