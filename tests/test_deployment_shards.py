"""Sharded jobs on real Prefect workers (issue 37): worker processes on a `process` work
pool, the store on PostgreSQL, the session slots in Redis — as several machines would run
them.

- A worker killed while it verifies one shard costs only that shard: the reaper gives it a
  second run, the other shards keep their first, and a single worker then finishes the
  job (the job's own run ended once it handed its shards out, so it never holds the one
  worker its shards wait for); it is charged once.
- Two workers verifying shards that share one mail server never hold more sessions there
  at once than the per-server cap: the slots are fleet-wide.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from api_helpers import STALE_AFTER, env_for_testbed, poll_job, running_app
from hardening_helpers import assert_ledger_exact

from verimail.runners.testing import kill_tree, prefect_worker, warm_worker, worker_env
from verimail.store import job_shards
from verimail.store.billing.pools import balance
from verimail.store.testing import temporary_database_url
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]

REDIS_URL = "redis://127.0.0.1:6379/0"


def _pool() -> str:
    return f"verimail-shards-{os.getpid()}"


async def _register(pool: str) -> None:
    from verimail.runners.deploy import register_deployments

    assert await asyncio.to_thread(register_deployments, pool, schedule=False)


def _env(tb: Testbed, url: str, data: Path, **extra: str) -> dict[str, str]:
    return worker_env(env_for_testbed(tb), database_url=url, data_dir=data, **extra)


SLOW = "mx.slow.test"


def _kill_world() -> World:
    """``slow.test`` (a shard of its own: 6 addresses, 0.15 s a reply) and three quick
    domains on one host, packed into the other shard (9 addresses)."""
    return World.of(
        [
            HostSpec(SLOW, HostBehaviour(mailboxes={"s0", "s2", "s4"}, reply_delay=0.15)),
            HostSpec("mx.quick.test", HostBehaviour(mailboxes={"a", "b"})),
        ],
        [
            DomainSpec("slow.test", mx=[(10, SLOW)]),
            *(DomainSpec(f"q{n}.test", mx=[(10, "mx.quick.test")]) for n in range(3)),
        ],
    )


async def test_a_killed_worker_costs_only_its_shard(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(_kill_world())
    pool = _pool()
    emails = [f"s{i}@slow.test" for i in range(6)]
    emails += [f"{who}@q{n}.test" for n in range(3) for who in ("a", "b", "zz")]
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb,
            tmp_path,
            database_url=url,
            runner="deployment",
            prefect_work_pool=pool,
            job_stale_after=STALE_AFTER,
            job_shard_size=9,
        )
        await _register(pool)
        env = _env(
            tb,
            url,
            tmp_path,
            VERIMAIL_JOB_STALE_AFTER=str(STALE_AFTER),
            VERIMAIL_JOB_SHARD_SIZE="9",
        )
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            with prefect_worker(pool, env, tmp_path / "first.log", limit=1) as first:
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                assert created.status_code == 200, created.text
                job_id = int(created.json()["job_id"])
                reached = await asyncio.to_thread(
                    tb.wait_until, lambda t: t.host_stats(SLOW).rcpt_to >= 2
                )
                assert reached, (tmp_path / "first.log").read_text(errors="replace")[-3000:]
                kill_tree(first.pid)  # mid-shard: the worker and its flow-run process
            shards = job_shards.shards_of(app.store.engine, job_id)
            slow = next(s for s in shards if "slow" in _domains(tmp_path, job_id, s.shard))
            with prefect_worker(pool, env, tmp_path / "second.log", limit=1):
                done = await poll_job(app.client, f"/api/verify/bulk/{job_id}", customer.headers)
            logs = "".join(
                (tmp_path / f"{n}.log").read_text(errors="replace") for n in ("first", "second")
            )
            assert done["status"] == "completed", (done, logs[-3000:])
            assert done["shards_total"] == done["shards_done"] == len(shards) >= 2
            assert done["processed_emails"] == len(emails)
            assert (done["valid_count"], done["invalid_count"]) == (9, 6)
            attempts = {s.shard: s.attempt for s in job_shards.shards_of(app.store.engine, job_id)}
            assert attempts[slow.shard] == 2, (attempts, logs[-3000:])
            assert all(a == 1 for n, a in attempts.items() if n != slow.shard), attempts
            quick = tb.host_stats("mx.quick.test").rcpts
            asked = [a for a in quick if not a.startswith("vm-probe-")]
            assert sorted(asked) == sorted(e for e in emails if "@q" in e)  # each once
            assert_ledger_exact(app.store, customer.account_id)
            assert balance(app.store.engine, customer.account_id).total == 100 - len(emails)


def _domains(data: Path, job_id: int, shard: int) -> str:
    """The addresses a shard was given, as one string (its input file)."""
    from verimail.files.bulk_io import job_dir
    from verimail.files.shards import read_shard_input

    frame = read_shard_input(job_dir(data, job_id), shard)
    return " ".join(frame.get_column("normalised").to_list())


BUSY = "mx.busy.test"


async def test_two_workers_keep_to_the_per_server_cap(testbed_factory, testbed_settings, tmp_path):
    """Three domains on one mail server, each a shard of its own (together they pass the
    shard size); two workers may run two shard runs each at once (which worker takes which
    run is Prefect's); with a cap of 2 sessions per server, the server sees 2 at once and
    never more."""
    domains = [f"d{n}.test" for n in range(3)]
    tb = testbed_factory(
        World.of(
            [HostSpec(BUSY, HostBehaviour(mailboxes={"u0", "u1"}, reply_delay=0.05))],
            [DomainSpec(d, mx=[(10, BUSY)]) for d in domains],
        )
    )
    pool = _pool()
    emails = [f"u{i}@{d}" for d in domains for i in range(5)]
    shared = {
        "VERIMAIL_REDIS_URL": REDIS_URL,
        "VERIMAIL_SMTP_MAX_SESSIONS_PER_HOST": "2",
        "VERIMAIL_SMTP_RCPTS_PER_SESSION": "2",  # (several sessions per shard)
        "VERIMAIL_JOB_SHARD_SIZE": "6",
    }
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        env = _env(tb, url, tmp_path, **shared)
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            with (
                prefect_worker(pool, env, tmp_path / "w1.log", limit=2),
                prefect_worker(pool, env, tmp_path / "w2.log", limit=2),
            ):
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                job_id = created.json()["job_id"]
                done = await poll_job(app.client, f"/api/verify/bulk/{job_id}", customer.headers)
            logs = "".join((tmp_path / f"w{n}.log").read_text(errors="replace") for n in (1, 2))
            assert done["status"] == "completed", (done, logs[-3000:])
            assert done["shards_total"] == 3
            assert (done["valid_count"], done["invalid_count"]) == (6, 9)
            stats = tb.host_stats(BUSY)
            assert stats.sessions >= 9  # (2 recipients a session: several per shard)
            assert stats.peak_concurrent == 2, stats


async def test_two_workers_started_as_documented_share_one_job(
    testbed_factory, testbed_settings, tmp_path
):
    """Issue 43.2: two workers started as docs/deployment.md says (`verimail worker`, no
    options) both run shards of one 7-shard job. (Prefect's process worker without
    `--limit` took all seven in 8 of 9 runs while the other idled.)"""
    domains = [f"d{n}.test" for n in range(7)]
    tb = testbed_factory(
        World.of(
            [
                HostSpec(f"mx.{d}", HostBehaviour(mailboxes={"u0"}, reply_delay=0.05))
                for d in domains
            ],
            [DomainSpec(d, mx=[(10, f"mx.{d}")]) for d in domains],
        )
    )
    pool = _pool()
    emails = [f"u{i}@{d}" for d in domains for i in range(3)]
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        env = _env(
            tb,
            url,
            tmp_path,
            VERIMAIL_REDIS_URL=REDIS_URL,
            VERIMAIL_JOB_SHARD_SIZE="3",
            VERIMAIL_PREFECT_WORK_POOL=pool,
        )
        logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            with (
                warm_worker(None, env, logs[0], limit=None, poll=None),
                warm_worker(None, env, logs[1], limit=None, poll=None),
            ):
                await asyncio.to_thread(_workers_online, pool, 2)
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                job_id = created.json()["job_id"]
                done = await poll_job(
                    app.client, f"/api/verify/bulk/{job_id}", customer.headers, timeout=240
                )
            shards = job_shards.shards_of(app.store.engine, int(job_id))
        texts = [p.read_text(errors="replace") for p in logs]
    assert done["status"] == "completed", (done, texts[0][-2000:], texts[1][-2000:])
    assert done["shards_total"] == done["shards_done"] == 7
    assert (done["valid_count"], done["invalid_count"]) == (7, 14)
    runs = {s.flow_run_id for s in shards}
    taken = [
        {r for r in runs if f"flow run {r} (verify-shard/verify-shard) claimed" in t} for t in texts
    ]
    assert taken[0] and taken[1], taken  # shards on both workers
    assert taken[0] | taken[1] == runs and not taken[0] & taken[1]  # each run once


def _workers_online(pool: str, count: int, timeout: float = 120.0) -> None:
    """Wait until ``count`` workers of ``pool`` have sent a heartbeat."""
    import time

    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while len(client.read_workers_for_work_pool(pool)) < count:
            assert time.monotonic() < deadline, f"fewer than {count} workers of {pool} online"
            time.sleep(0.2)  # (processes starting: nothing to await but their heartbeats)
