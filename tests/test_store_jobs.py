"""Jobs: atomic creation with reservation, ownership, guarded transitions, refunds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import ColumnElement, Table, func, select

from verimail.store import accounts as acc
from verimail.store import jobs as jb
from verimail.store.billing.job_charges import charge_for_run, finder_row_reference, refund_for_run
from verimail.store.billing.ledger import ledger
from verimail.store.billing.pools import balance
from verimail.store.db import Store, utcnow
from verimail.store.job_retries import claim_for_resume
from verimail.store.tables import credit_ledger, jobs
from verimail.store.testing import temporary_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture
def account_id(store: Store) -> int:
    """An Enterprise account (no allowance) with the 100 signup credits."""
    return acc.create_account(store.engine, store.settings, plan="enterprise").id


def _count(store: Store, table: Table, *where: ColumnElement[bool]) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def _refund_rows(store: Store, job_id: int) -> int:
    return _count(
        store,
        credit_ledger,
        credit_ledger.c.kind == "refund",
        credit_ledger.c.reference == f"job:{job_id}",
    )


def test_create_job_reserves_in_the_same_transaction(store: Store, account_id: int) -> None:
    job = jb.create_job(
        store.engine,
        account_id,
        "bulk_csv",
        40,
        reserve=40,
        upload_path="/tmp/u.csv",
        email_column="Email",
        options={"dedupe": True, "columns": ["a", "b"]},
    )
    assert job is not None
    assert (job.status, job.total_emails, job.credits_reserved) == ("pending", 40, 40)
    assert job.public_id.startswith("job_")
    assert job.options == {"dedupe": True, "columns": ["a", "b"]}
    assert balance(store.engine, account_id).total == 60
    [row] = [e for e in ledger(store.engine, account_id) if e.kind == "reserve"]
    assert (row.delta, row.reference) == (-40, f"job:{job.id}")


def test_short_credits_create_neither_job_nor_ledger_row(store: Store, account_id: int) -> None:
    ledger_before = _count(store, credit_ledger)
    assert jb.create_job(store.engine, account_id, "bulk_csv", 101, reserve=101) is None
    assert _count(store, jobs) == 0
    assert _count(store, credit_ledger) == ledger_before
    assert balance(store.engine, account_id).total == 100


def test_concurrent_job_creation_never_overdraws(store: Store, account_id: int) -> None:
    barrier = threading.Barrier(10)

    def one(_: int) -> jb.Job | None:
        barrier.wait()
        return jb.create_job(store.engine, account_id, "bulk_json", 30, reserve=30)

    with ThreadPoolExecutor(max_workers=10) as pool:
        created = [j for j in pool.map(one, range(10)) if j is not None]
    assert len(created) == 3  # 3 × 30 ≤ 100 < 4 × 30
    assert _count(store, jobs) == 3
    assert balance(store.engine, account_id).total == 10


def test_finder_jobs_get_fj_public_ids(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "finder_csv", 5, reserve=0)
    assert job is not None and job.public_id.startswith("fj_")
    assert jb.get_job_by_public_id(store.engine, account_id, job.public_id) == job
    with pytest.raises(ValueError):
        jb.create_job(store.engine, account_id, "mystery", 1, reserve=0)  # type: ignore[arg-type]


def test_another_accounts_job_is_invisible(store: Store, account_id: int) -> None:
    other = acc.create_account(store.engine, store.settings).id
    job = jb.create_job(store.engine, account_id, "finder_csv", 3, reserve=0)
    assert job is not None
    assert jb.get_job(store.engine, other, job.id) is None
    assert jb.get_job_by_public_id(store.engine, other, job.public_id) is None
    assert jb.list_jobs(store.engine, other) == []
    assert jb.get_job(store.engine, account_id, job.id) == job
    assert jb.get_job_any(store.engine, job.id) == job
    assert jb.get_job(store.engine, account_id, job.id + 1000) is None


def test_list_jobs_newest_first_and_by_kind(store: Store, account_id: int) -> None:
    a = jb.create_job(store.engine, account_id, "bulk_csv", 1, reserve=1)
    b = jb.create_job(store.engine, account_id, "finder_csv", 1, reserve=0)
    c = jb.create_job(store.engine, account_id, "bulk_csv", 1, reserve=1)
    assert a and b and c
    assert [j.id for j in jb.list_jobs(store.engine, account_id)] == [c.id, b.id, a.id]
    assert [j.id for j in jb.list_jobs(store.engine, account_id, kind="bulk_csv")] == [c.id, a.id]
    assert [j.id for j in jb.list_jobs(store.engine, account_id, limit=1, offset=1)] == [b.id]


def test_happy_path_progress_and_completion_refunds_unused(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "bulk_csv", 10, reserve=10)
    assert job is not None
    assert jb.mark_processing(store.engine, job.id, unique_emails=8, flow_run_id="run-1")
    assert jb.update_progress(store.engine, job.id, 4, {"valid": 2, "catchall": 1, "unknown": 1})
    mid = jb.get_job_any(store.engine, job.id)
    assert mid is not None
    assert (mid.status, mid.processed_emails, mid.valid_count, mid.catch_all_count) == (
        "processing",
        4,
        2,
        1,
    )
    assert (mid.unique_emails, mid.flow_run_id) == (8, "run-1")
    assert mid.started_at is not None and mid.heartbeat_at is not None
    with pytest.raises(ValueError):
        jb.update_progress(store.engine, job.id, 5, {"bogus": 1})

    assert jb.mark_completed(
        store.engine,
        job.id,
        {"valid_count": 5, "invalid": 2, "catch_all": 1, "risky": 0},
        "/tmp/result.csv",
        credits_used=8,
        processed=8,
    )
    done = jb.get_job_any(store.engine, job.id)
    assert done is not None and done.finished
    assert (done.status, done.valid_count, done.invalid_count, done.result_path) == (
        "completed",
        5,
        2,
        "/tmp/result.csv",
    )
    assert (done.credits_used, done.credits_refunded, done.processed_emails) == (8, 2, 8)
    assert balance(store.engine, account_id).total == 92  # 100 − 10 reserved + 2 back
    assert _refund_rows(store, job.id) == 1


def test_transitions_are_guarded(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "bulk_csv", 2, reserve=2)
    assert job is not None
    # pending: cannot complete, report progress or beat
    assert not jb.mark_completed(store.engine, job.id, {}, "/r.csv", 2)
    assert not jb.update_progress(store.engine, job.id, 1)
    assert not jb.heartbeat(store.engine, job.id)
    assert jb.mark_processing(store.engine, job.id)
    assert not jb.mark_processing(store.engine, job.id)  # no second start
    assert jb.heartbeat(store.engine, job.id)
    assert jb.mark_completed(store.engine, job.id, {}, "/r.csv", 2)
    # completed is final
    for attempt in (
        lambda: jb.mark_processing(store.engine, job.id),
        lambda: jb.mark_completed(store.engine, job.id, {}, "/r2.csv", 0),
        lambda: jb.mark_failed(store.engine, job.id, "late reaper"),
        lambda: jb.update_progress(store.engine, job.id, 1),
        lambda: jb.heartbeat(store.engine, job.id),
    ):
        assert not attempt()
    final = jb.get_job_any(store.engine, job.id)
    assert final is not None
    assert (final.status, final.result_path, final.credits_refunded) == ("completed", "/r.csv", 0)
    assert not jb.mark_processing(store.engine, 12345)  # unknown job
    assert not jb.mark_failed(store.engine, 12345, "ghost")


def test_pending_job_can_fail_and_failed_is_final(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "bulk_csv", 20, reserve=20)
    assert job is not None
    assert jb.mark_failed(store.engine, job.id, "upload unreadable")
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None
    assert (failed.status, failed.failed_reason, failed.credits_refunded) == (
        "failed",
        "upload unreadable",
        20,
    )
    assert balance(store.engine, account_id).total == 100
    assert not jb.mark_processing(store.engine, job.id)
    assert not jb.mark_completed(store.engine, job.id, {}, "/r.csv", 0)


def test_mark_failed_refunds_once_even_when_raced(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "bulk_csv", 50, reserve=50)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    assert balance(store.engine, account_id).total == 50
    barrier = threading.Barrier(8)

    def fail(_: int) -> bool:
        barrier.wait()
        return jb.mark_failed(store.engine, job.id, "worker crashed", refund=30)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(fail, range(8)))
    assert results.count(True) == 1
    assert not jb.mark_failed(store.engine, job.id, "again", refund=30)
    assert _refund_rows(store, job.id) == 1
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None
    assert (failed.credits_refunded, failed.credits_used) == (30, 20)
    assert balance(store.engine, account_id).total == 80


def test_refund_is_capped_at_the_reservation(store: Store, account_id: int) -> None:
    job = jb.create_job(store.engine, account_id, "bulk_csv", 10, reserve=10)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    assert jb.mark_failed(store.engine, job.id, "boom", refund=1_000)
    assert balance(store.engine, account_id).total == 100
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None and failed.credits_refunded == 10


def test_find_stale_processing(store: Store, account_id: int) -> None:
    t0 = utcnow()
    old = jb.create_job(store.engine, account_id, "bulk_csv", 1, reserve=1, now=t0)
    fresh = jb.create_job(store.engine, account_id, "bulk_csv", 1, reserve=1, now=t0)
    never = jb.create_job(store.engine, account_id, "bulk_csv", 1, reserve=1, now=t0)
    assert old and fresh and never
    jb.mark_processing(store.engine, old.id, now=t0)
    jb.mark_processing(store.engine, fresh.id, now=t0)
    jb.heartbeat(store.engine, fresh.id, now=t0 + timedelta(minutes=9))
    later = t0 + timedelta(minutes=10)
    stale = jb.find_stale_processing(store.engine, timedelta(minutes=5), now=later)
    assert [j.id for j in stale] == [old.id]
    with_pending = jb.find_stale_processing(
        store.engine, timedelta(minutes=5), now=later, include_pending=True
    )
    assert [j.id for j in with_pending] == [old.id, never.id]
    assert jb.find_stale_processing(store.engine, timedelta(minutes=30), now=later) == []


@pytest.mark.parametrize("job_id", [0, -1, 2**31, 3_000_000_000, 2**63, 10**20])
def test_ids_outside_the_key_range_name_no_job(store: Store, account_id: int, job_id: int) -> None:
    """Ids from URLs beyond the INTEGER key: None on both backends (PostgreSQL raised
    "integer out of range" for 3,000,000,000, which was a 500)."""
    assert jb.get_job(store.engine, account_id, job_id) is None


@pytest.mark.parametrize("public_id", ["\x00", "fj_\x00", "fj_" + "a" * 70, "fj_é", "", "a b"])
def test_public_ids_that_are_not_id_shaped_name_no_job(
    store: Store, account_id: int, public_id: str
) -> None:
    """A NUL byte made PostgreSQL raise ("cannot contain NUL"), a 500; any such id is None."""
    assert jb.get_job_by_public_id(store.engine, account_id, public_id) is None


def test_a_superseded_run_cannot_settle_or_move_the_job(store: Store, account_id: int) -> None:
    """Recovery resumed the job as run 2 while run 1 was only frozen: run 1's progress,
    completion and failure are refused (nothing refunded), run 2's are not, and callers that
    are not runs (recovery, no attempt) still may."""
    job = jb.create_job(store.engine, account_id, "bulk_csv", 4, reserve=4)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    fresh = jb.get_job_any(store.engine, job.id)
    assert fresh is not None
    assert claim_for_resume(store.engine, job.id, fresh.heartbeat_at) == 2
    assert not jb.update_progress(store.engine, job.id, 3, attempt=1)
    assert not jb.mark_failed(store.engine, job.id, "run 1 crashed", attempt=1)
    assert not jb.mark_completed(store.engine, job.id, {}, "/run1.csv", 4, attempt=1)
    after = jb.get_job_any(store.engine, job.id)
    assert after is not None
    assert (after.status, after.processed_emails, after.credits_refunded) == ("processing", 0, 0)
    assert jb.update_progress(store.engine, job.id, 2, attempt=2)
    assert jb.update_progress(store.engine, job.id, 3)
    assert jb.mark_completed(store.engine, job.id, {}, "/run2.csv", 3, attempt=2)
    done = jb.get_job_any(store.engine, job.id)
    assert done is not None
    assert (done.status, done.result_path, done.credits_refunded) == ("completed", "/run2.csv", 1)
    assert _refund_rows(store, job.id) == 1


def test_a_failed_job_refunds_what_it_had_not_verified_when_it_failed(
    store: Store, account_id: int
) -> None:
    """UNVERIFIED is counted from the locked row: a progress write that lands after the
    failing run looked (a chunk settling while it is cancelled) is not refunded."""
    job = jb.create_job(store.engine, account_id, "bulk_csv", 10, reserve=10)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    assert jb.update_progress(store.engine, job.id, 4)
    looked = jb.get_job_any(store.engine, job.id)
    assert looked is not None and looked.processed_emails == 4
    assert jb.update_progress(store.engine, job.id, 7)  # lands after the look
    assert jb.mark_failed(store.engine, job.id, "cancelled", jb.UNVERIFIED)
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None
    assert (failed.credits_refunded, failed.credits_used) == (3, 7)


def test_a_failed_finder_job_gives_back_its_finds(store: Store, account_id: int) -> None:
    """A find is charged only when it is reported; a failed finder job reports none (no
    results are written), so failing it gives back every find it charged — once."""
    job = jb.create_job(store.engine, account_id, "finder_csv", 3, reserve=0)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    run = jb.get_job_any(store.engine, job.id)
    assert run is not None
    before = balance(store.engine, account_id).total
    for row in range(3):
        reference = finder_row_reference(job.id, row)
        assert charge_for_run(store.engine, run, 10, reference=reference) == "charged"
    jb.update_progress(store.engine, job.id, 3, credits_used=30, attempt=run.attempt)
    assert balance(store.engine, account_id).total == before - 30
    assert jb.mark_failed(store.engine, job.id, "the flow crashed", 0)
    assert not jb.mark_failed(store.engine, job.id, "again", 0)
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None
    assert (failed.credits_used, failed.credits_refunded) == (0, 0)  # (it reserved nothing)
    assert balance(store.engine, account_id).total == before
    assert _refund_rows(store, job.id) == 0  # (the reservation refunds: none, it has none)


def test_a_failed_finder_job_uses_nothing_whatever_its_last_progress_said(
    store: Store, account_id: int
) -> None:
    """A run gave a find back, then died before its progress flush: the job's last
    credits_used still held that find. Failing the job gives every find back, so the job
    has used nothing; it reported 10."""
    job = jb.create_job(store.engine, account_id, "finder_csv", 2, reserve=0)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    run = jb.get_job_any(store.engine, job.id)
    assert run is not None
    before = balance(store.engine, account_id).total
    row = finder_row_reference(job.id, 0)
    assert charge_for_run(store.engine, run, 10, reference=row) == "charged"
    jb.update_progress(store.engine, job.id, 1, credits_used=10, attempt=run.attempt)
    assert refund_for_run(store.engine, run, reference=row, reason="not found") == 10
    assert jb.mark_failed(store.engine, job.id, "the runner died", 0)
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None and failed.credits_used == 0
    assert balance(store.engine, account_id).total == before


def test_a_finder_job_failed_with_kept_finds_charges_those_and_no_other(
    store: Store, account_id: int
) -> None:
    """A finder job its owner stopped hands over the finds of its partial results: their
    charges stay (and are its credits_used), a find charged after the rows were read is
    given back, and the ledger says the same as the job row."""
    job = jb.create_job(store.engine, account_id, "finder_csv", 3, reserve=0)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    run = jb.get_job_any(store.engine, job.id)
    assert run is not None
    before = balance(store.engine, account_id).total
    for row in (0, 2):
        reference = finder_row_reference(job.id, row)
        assert charge_for_run(store.engine, run, 10, reference=reference) == "charged"
    assert jb.mark_failed(store.engine, job.id, "cancelled", 0, keep_finds=[0, 1])
    failed = jb.get_job_any(store.engine, job.id)
    assert failed is not None and failed.credits_used == 10
    assert balance(store.engine, account_id).total == before - 10
    assert _refund_rows(store, job.id) == 0  # (nothing reserved, nothing of it refunded)
    assert not jb.mark_failed(store.engine, job.id, "again")  # (and never twice)
    assert balance(store.engine, account_id).total == before - 10


def test_only_the_run_that_has_a_finder_job_pays_or_refunds(store: Store, account_id: int) -> None:
    """A finder run charges each find under its row, and gives back a charge it no longer
    finds; once recovery resumed the job as run 2, run 1 can do neither (the check is in
    the charge's transaction), run 2 can, and nobody can once the job is completed."""
    job = jb.create_job(store.engine, account_id, "finder_csv", 3, reserve=0)
    assert job is not None and jb.mark_processing(store.engine, job.id)
    run_1 = jb.get_job_any(store.engine, job.id)
    assert run_1 is not None and run_1.attempt == 1
    row = f"job:{job.id}:row:0"
    assert charge_for_run(store.engine, run_1, 10, reference=row) == "charged"
    assert charge_for_run(store.engine, run_1, 10, reference=row) == "already"
    assert claim_for_resume(store.engine, job.id, run_1.heartbeat_at) == 2
    before = balance(store.engine, account_id).total
    other = f"job:{job.id}:row:1"
    assert charge_for_run(store.engine, run_1, 10, reference=other) == "superseded"
    assert refund_for_run(store.engine, run_1, reference=row, reason="r") == "superseded"
    assert balance(store.engine, account_id).total == before
    run_2 = jb.get_job_any(store.engine, job.id)
    assert run_2 is not None and run_2.attempt == 2
    assert refund_for_run(store.engine, run_2, reference=row, reason="not found") == 10
    assert refund_for_run(store.engine, run_2, reference=row, reason="again") == 0
    assert jb.mark_completed(store.engine, job.id, {}, "/r.csv", 3, attempt=2)
    assert charge_for_run(store.engine, run_2, 10, reference=other) == "superseded"
    assert balance(store.engine, account_id).total == before + 10
