"""Restart safety with the local runner: a ``verimail serve`` process dies (SIGKILL) or is
stopped (SIGTERM) in the middle of a bulk job, and a new process is started on the same
database and data dir.

- one death: the new process's reaper sees the heartbeat go stale
  (``VERIMAIL_JOB_STALE_AFTER``: ``STALE_AFTER``), resumes the job, and it completes — charged once;
- two deaths: the job is out of runs (``job_max_attempts`` = 2), so it fails and refunds
  exactly what it did not verify;
- SIGTERM: the process exits at once (uvicorn re-raises the signal after its HTTP
  shutdown, before worker threads are joined), so the running job is abandoned like on a
  crash and the next process resumes and completes it.

Either way no job stays ``processing``, and the ledger reads as one exact running balance.
The job is made slow by a testbed host's ``reply_delay``; "mid-job" is detected by polling
the API and the testbed's session counters, never by sleeping.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from api_helpers import PATIENCE, STALE_AFTER, make_customer, serve_processes
from hardening_helpers import assert_ledger_exact, assert_no_open_jobs, serve_env

from verimail.config import Settings
from verimail.jobs.context import forget, store_for
from verimail.jobs.recovery import recover_stale_jobs
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.store.db import init_store, utcnow
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

SLOW_HOST = "mx.tortoise.test"
CREDITS = 100


def _world(slow_rows: int) -> World:
    return World.of(
        [
            HostSpec(
                SLOW_HOST,
                HostBehaviour(
                    mailboxes={f"user{i}" for i in range(0, slow_rows, 2)}, reply_delay=0.1
                ),
            ),
        ],
        [DomainSpec("tortoise.test", mx=[(10, SLOW_HOST)])],
    )


def _upload(slow_rows: int) -> bytes:
    """Addresses on the slow host, plus rows decided without SMTP (bad syntax, no domain):
    those count as verified as soon as DNS is done, so a failure refunds only the rest."""
    lines = ["email"] + [f"user{i}@tortoise.test" for i in range(slow_rows)]
    lines += ["not-an-address", "someone@nowhere-at-all.test"]
    return ("\n".join(lines) + "\n").encode()


def _job(client: httpx.Client, base: str, headers: dict, job_id: int) -> dict:
    response = client.get(f"{base}/api/bulk/{job_id}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def _poll(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stop_mid_job(server, tb: Testbed, how: str, sessions_before: int) -> None:
    """Wait until this process has a live SMTP session on the slow host, then stop it."""
    assert tb.wait_until(
        lambda t: (
            t.host_stats(SLOW_HOST).sessions > sessions_before
            and t.host_stats(SLOW_HOST).active >= 1
        ),
        timeout=PATIENCE,
    ), "the job never reached the slow host"
    if how == "kill":
        server.process.kill()
    else:
        server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=120)


@pytest.mark.parametrize(
    ("how", "deaths"),
    [("kill", 1), ("kill", 2), pytest.param("term", 1, marks=pytest.mark.slow)],
)
def test_bulk_job_survives_its_process(
    testbed_factory, tmp_path: Path, how: str, deaths: int
) -> None:
    slow_rows = 24
    tb = testbed_factory(_world(slow_rows))
    data = tmp_path / "data"
    store = init_store(Settings(data_dir=data))  # SQLite: a killed writer must not corrupt it
    try:
        customer = make_customer(store, plan="enterprise", credits=CREDITS)
        env = serve_env(
            tb,
            str(Settings(data_dir=data).database_url),
            data,
            VERIMAIL_JOB_STALE_AFTER=str(STALE_AFTER),
        )
        headers = customer.headers
        total = slow_rows + 2
        with httpx.Client(timeout=30) as client:
            # --- the first process takes the job and is stopped in the middle of it ------
            (tmp_path / "p0").mkdir()
            with serve_processes(1, env, tmp_path / "p0") as [first]:
                created = client.post(
                    first.base_url + "/api/bulk",
                    headers=headers,
                    files={"file": ("l.csv", _upload(slow_rows), "text/csv")},
                )
                assert created.status_code == 200, created.text
                job_id = created.json()["job_id"]
                _poll(
                    lambda: _job(client, first.base_url, headers, job_id)["status"] == "processing",
                    PATIENCE,
                    "the job to start",
                )
                _stop_mid_job(first, tb, how, 0)
                logs = first.log()
            # --- later processes pick it up ---------------------------------------------
            for generation in range(1, deaths + 1):
                workdir = tmp_path / f"p{generation}"
                workdir.mkdir()
                with serve_processes(1, env, workdir) as [server]:
                    if generation < deaths:  # it resumes the job; stop this one too
                        _stop_mid_job(server, tb, how, tb.host_stats(SLOW_HOST).sessions)
                    else:
                        _poll(
                            lambda s=server: (
                                _job(client, s.base_url, headers, job_id)["status"]
                                in ("completed", "failed")
                            ),
                            PATIENCE,
                            "the job to finish",
                        )
                        final = _job(client, server.base_url, headers, job_id)
                    logs += server.log()

        job = job_store.get_job_any(store.engine, job_id)
        assert job is not None
        # One run per process that touched it: SIGTERM too abandons the running job (uvicorn
        # re-raises the signal once its HTTP shutdown is done, before any thread is joined).
        assert (job.options or {}).get("attempts", 1) == deaths + 1
        if deaths == 1:
            assert final["status"] == "completed", final
            assert final["processed_emails"] == total
            assert final["valid_count"] == slow_rows // 2
            assert final["invalid_count"] == slow_rows // 2 + 2
            assert job.credits_used == total and job.credits_refunded == 0
            expected_balance = CREDITS - total
        else:
            assert final["status"] == "failed", final
            assert "could not be resumed" in (final["failed_reason"] or "")
            # Refunded exactly what it did not verify; the decided rows stay charged.
            assert job.credits_refunded == total - job.processed_emails
            assert job.processed_emails in (0, 2)
            expected_balance = CREDITS - job.processed_emails
        assert balance(store.engine, customer.account_id).total == expected_balance
        assert_ledger_exact(store, customer.account_id)
        assert_no_open_jobs(store)
        assert customer.key not in logs
    finally:
        store.close()


class HoldingRunner:
    """A runner that still holds one job (queued behind others), like a busy LocalRunner."""

    def __init__(self, held: list[int]) -> None:
        self.held = held
        self.submitted: list[int] = []

    def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
        self.submitted.append(job_id)

    def shutdown(self) -> None:
        return None

    def held_jobs(self) -> list[int]:
        return list(self.held)


def test_a_queued_job_is_not_resumed_while_its_process_lives(tmp_path: Path) -> None:
    """Regression: a job waiting for a worker thread longer than ``job_stale_after`` was
    "resumed" (submitted twice) and later failed as out of attempts. The reaper now beats
    the jobs its own runner holds, so only a job whose process is gone goes stale."""
    settings = Settings(data_dir=tmp_path, job_stale_after=2.0)
    store = store_for(settings)
    try:
        customer = make_customer(store, plan="enterprise", credits=CREDITS)
        long_ago = utcnow() - timedelta(minutes=5)
        queued, orphan = (
            job_store.create_job(
                store.engine, customer.account_id, "bulk_csv", 1, reserve=1, now=long_ago
            )
            for _ in range(2)
        )
        runner = HoldingRunner([queued.id])
        assert recover_stale_jobs(settings, runner) == [(orphan.id, "resumed")]
        assert runner.submitted == [orphan.id]
        again = job_store.get_job_any(store.engine, queued.id)
        assert again.status == "pending" and again.heartbeat_at > long_ago
    finally:
        forget(settings)
