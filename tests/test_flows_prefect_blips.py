"""A Prefect API that answers 503 for a while when a job's run starts (issue 47.7): the run
is tried again, with growing waits, and the job completes, instead of failing on its first
run with an "internal error" and a refund; a Prefect that keeps failing still fails the job,
refunded, after a bounded number of tries.

Prefect's client retries each request itself (five times, 2 to 32 s apart); here it is
allowed one retry, so that what happens once those run out is seen in seconds. The 503s come
from a loopback proxy in front of the session's Prefect server (``flaky_prefect.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import prefect.context
import pytest
from flaky_prefect import FlakyPrefect, flaky_prefect
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from verimail.jobs.context import forget, store_for
from verimail.runners import prefect_retries
from verimail.runners.local import LocalRunner
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


@contextlib.contextmanager
def _prefect_through_proxy() -> Iterator[FlakyPrefect]:
    """This process's Prefect client on the proxy (threads that do not inherit the context
    read the global settings: the runner's), allowed one retry of its own per request."""
    upstream = PREFECT_API_URL.value().removesuffix("/api")
    with (
        flaky_prefect(upstream) as (proxy, url),
        temporary_settings(updates={PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 1}),
        prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()),
    ):
        yield proxy


def _refuse_first(proxy: FlakyPrefect, n: int | None) -> None:
    """503 for the first ``n`` requests of a run (all of them: None), the runner's first
    ``/api/hello`` aside (it is answered, as to a server that just started failing)."""
    seen = [0]

    def refuse(method: str, path: str) -> bool:
        if path == "/api/hello":
            return False
        seen[0] += 1
        return n is None or seen[0] <= n

    proxy.refuse = refuse


@pytest.fixture
def bulk_job(testbed_factory, testbed_settings, tmp_path, monkeypatch):
    """(settings, store, a pending bulk job of 4 addresses, 2 of them valid); the runner
    tries a run twice, 0.2 s apart (each try of a run's start costs seconds)."""
    monkeypatch.setattr(prefect_retries, "PREFECT_RETRY_DELAYS", (0.2,))
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.acme.test", HostBehaviour(mailboxes={"u0", "u2"}))],
            [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
        )
    )
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    upload = tmp_path / "up.csv"
    upload.write_text("email\n" + "".join(f"u{i}@acme.test\n" for i in range(4)))
    job = job_store.create_job(
        store.engine, account.id, "bulk_csv", 4, reserve=4, upload_path=str(upload)
    )
    yield settings, store, job
    forget(settings)


def _run(settings, job_id: int) -> None:
    runner = LocalRunner(settings)
    try:
        runner.submit("bulk", job_id)
        runner.wait(240)
    finally:
        runner.shutdown()


def test_a_run_rides_out_a_prefect_api_answering_503_for_a_while(bulk_job):
    settings, store, job = bulk_job
    with _prefect_through_proxy() as proxy:
        _refuse_first(proxy, 2)  # (the run's first try: the client's request and its retry)
        _run(settings, job.id)
    assert len(proxy.refused) == 2  # the 503s were answered
    assert proxy.forwarded  # and then the run went through
    done = job_store.get_job_any(store.engine, job.id)
    assert done.status == "completed", done.failed_reason
    assert (done.processed_emails, done.valid_count) == (4, 2)
    assert (done.credits_used, done.credits_refunded) == (4, 0)


def test_a_prefect_api_that_keeps_failing_fails_the_job_after_bounded_tries(bulk_job):
    settings, store, job = bulk_job
    with _prefect_through_proxy() as proxy:
        _refuse_first(proxy, None)
        _run(settings, job.id)
    tries = len(prefect_retries.PREFECT_RETRY_DELAYS) + 1
    assert len(proxy.refused) == 2 * tries  # (each try: the client's request and its retry)
    done = job_store.get_job_any(store.engine, job.id)
    assert done.status == "failed"
    assert "internal error" in done.failed_reason
    assert (done.credits_used, done.credits_refunded) == (0, 4)
