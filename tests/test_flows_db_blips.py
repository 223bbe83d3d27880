"""A database that is briefly unreachable during a run (one failed progress write, one
failed finder charge) is ridden out: the run tries the call again and the job completes,
instead of failing with every SMTP probe thrown away and its credits refunded."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from verimail.jobs.context import forget, store_for
from verimail.runners.local import LocalRunner
from verimail.store import accounts, billing
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

STAFF = {"u0", "u2", "ann.lee", "bob.stone"}


def _fails_once(monkeypatch, name: str, nth: int, module=job_store) -> list[int]:
    """Make ``module.<name>`` (a store module: the jobs' by default) raise what a dropped
    connection raises on its ``nth`` call (before touching the database), then work again."""
    real = getattr(module, name)
    calls: list[int] = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            raise OperationalError("UPDATE jobs", {}, Exception("server closed the connection"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky)
    return calls


def _run(settings, kind: str, job_id: int) -> None:
    runner = LocalRunner(settings)
    try:
        runner.submit(kind, job_id)
        runner.wait(120)
    finally:
        runner.shutdown()
        forget(settings)


def _finder_job(settings, tmp_path):
    """(store, account with 100 credits, a finder job for two people who both exist)."""
    store = store_for(settings)
    funded = settings.model_copy(update={"signup_credits": 100})
    account = accounts.create_account(store.engine, funded, plan="enterprise")
    upload = tmp_path / "people.csv"
    upload.write_text("first_name,last_name,domain\nAnn,Lee,acme.test\nBob,Stone,acme.test\n")
    job = job_store.create_job(
        store.engine, account.id, "finder_csv", 2, reserve=0, upload_path=str(upload)
    )
    return store, account, job


@pytest.fixture
def world_settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.acme.test", HostBehaviour(mailboxes=STAFF))],
            [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
        )
    )
    return testbed_settings(tb, tmp_path, job_stale_after=120, finder_charge=1)


def test_a_bulk_run_rides_out_a_failed_progress_write(world_settings, tmp_path, monkeypatch):
    store = store_for(world_settings)
    account = accounts.create_account(store.engine, world_settings, plan="enterprise")
    upload = tmp_path / "up.csv"
    upload.write_text("email\n" + "".join(f"u{i}@acme.test\n" for i in range(40)))
    job = job_store.create_job(
        store.engine, account.id, "bulk_csv", 40, reserve=40, upload_path=str(upload)
    )
    calls = _fails_once(monkeypatch, "update_progress", 2)  # (after the first host group)
    _run(world_settings, "bulk", job.id)
    after = job_store.get_job_any(store.engine, job.id)
    assert len(calls) >= 2  # the failure did happen
    assert after.status == "completed", after.failed_reason
    assert (after.processed_emails, after.valid_count) == (40, 2)


def test_a_finder_run_rides_out_a_failed_charge(world_settings, tmp_path, monkeypatch):
    store, account, job = _finder_job(world_settings, tmp_path)
    calls = _fails_once(monkeypatch, "charge_for_run", 2, billing)  # (the second find's charge)
    _run(world_settings, "finder", job.id)
    after = job_store.get_job_any(store.engine, job.id)
    assert len(calls) >= 3  # the second charge failed once and was made again
    assert after.status == "completed", after.failed_reason
    assert after.credits_used == 2
    assert balance(store.engine, account.id).total == 100 - 2


def test_a_find_charged_before_its_connection_dropped_is_counted_once(
    world_settings, tmp_path, monkeypatch
):
    """The charge's COMMIT went through but its answer was lost: the call made again finds
    the row paid ("already"). The run did not count it, and the job reported fewer
    credits_used than the account was charged."""
    store, account, job = _finder_job(world_settings, tmp_path)
    real = billing.charge_for_run
    calls: list[str] = []

    def committed_then_lost(*args, **kwargs):
        outcome = real(*args, **kwargs)
        calls.append(outcome)
        if len(calls) == 1:
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return outcome

    monkeypatch.setattr(billing, "charge_for_run", committed_then_lost)
    _run(world_settings, "finder", job.id)
    after = job_store.get_job_any(store.engine, job.id)
    assert calls[:2] == ["charged", "already"]
    assert after.status == "completed", after.failed_reason
    assert balance(store.engine, account.id).total == 100 - 2
    assert after.credits_used == 2
