"""Credits: allowance before prepaid, period resets, all-or-nothing charges, no overdraw."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from verimail.store import accounts as acc
from verimail.store.billing.ledger import charges_under, ledger
from verimail.store.billing.movements import (
    charge,
    charge_once,
    grant,
    refund,
    refund_once,
    reserve,
)
from verimail.store.billing.pools import AccountNotFound, balance
from verimail.store.db import Store
from verimail.store.tables import accounts, credit_ledger
from verimail.store.testing import temporary_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

DAY = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture(params=BACKENDS)
def store20(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store whose new accounts start with 20 prepaid credits."""
    with temporary_store(request.param, tmp_path, signup_credits=20) as s:
        yield s


def _prepaid_ledger_sum(store: Store, account_id: int) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.coalesce(func.sum(credit_ledger.c.delta), 0)).where(
                credit_ledger.c.account_id == account_id, credit_ledger.c.source == "prepaid"
            )
        ).scalar_one()


def _ledger_count(store: Store, account_id: int) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(credit_ledger.c.account_id == account_id)
        ).scalar_one()


def _assert_consistent(store: Store, account_id: int) -> None:
    """The prepaid column is exactly what the prepaid ledger rows add up to."""
    with store.engine.connect() as conn:
        prepaid = conn.execute(
            select(accounts.c.prepaid_credits).where(accounts.c.id == account_id)
        ).scalar_one()
    assert prepaid == _prepaid_ledger_sum(store, account_id)


def test_allowance_is_spent_before_prepaid(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="free")
    start = balance(store.engine, a.id, now=DAY)
    assert (start.prepaid, start.allowance_remaining, start.total) == (100, 25, 125)
    assert start.period_resets_at == datetime(2026, 3, 11, tzinfo=UTC)

    assert charge(store.engine, a.id, 10, reason="single", reference="single:1", now=DAY)
    b = balance(store.engine, a.id, now=DAY)
    assert (b.prepaid, b.allowance_remaining, b.total) == (100, 15, 115)

    assert charge(store.engine, a.id, 20, reason="batch", reference="batch:2", now=DAY)
    b = balance(store.engine, a.id, now=DAY)
    assert (b.prepaid, b.allowance_remaining, b.total) == (95, 0, 95)

    rows = [(e.kind, e.source, e.delta, e.balance_after) for e in ledger(store.engine, a.id)]
    assert rows == [
        # balance_after is the balance of the row's pool
        ("charge", "prepaid", -5, 95),  # the 20-credit charge split over both pools
        ("charge", "allowance", -15, 0),
        ("charge", "allowance", -10, 15),
        ("allowance", "allowance", 25, 25),  # first charge of the day opens the period
        ("signup", "prepaid", 100, 100),
    ]
    _assert_consistent(store, a.id)


def test_daily_allowance_resets_at_utc_midnight(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="free")
    assert charge(store.engine, a.id, 25, reason="x", now=DAY)
    assert balance(store.engine, a.id, now=DAY).allowance_remaining == 0
    last_second = datetime(2026, 3, 10, 23, 59, 59, tzinfo=UTC)
    assert balance(store.engine, a.id, now=last_second).allowance_remaining == 0

    next_day = datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC)
    b = balance(store.engine, a.id, now=next_day)
    assert (b.prepaid, b.allowance_remaining) == (100, 25)
    assert charge(store.engine, a.id, 5, reason="x", now=next_day)
    b = balance(store.engine, a.id, now=next_day)
    assert (b.prepaid, b.allowance_remaining) == (100, 20)  # prepaid untouched
    _assert_consistent(store, a.id)


def test_monthly_allowance_resets_on_the_first(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="starter")
    jan = datetime(2026, 1, 31, 23, 0, tzinfo=UTC)
    assert charge(store.engine, a.id, 5_010, reason="big", now=jan)
    b = balance(store.engine, a.id, now=jan)
    assert (b.prepaid, b.allowance_remaining) == (90, 0)
    assert b.period_resets_at == datetime(2026, 2, 1, tzinfo=UTC)

    feb = datetime(2026, 2, 1, 0, 0, tzinfo=UTC)
    b = balance(store.engine, a.id, now=feb)
    assert (b.prepaid, b.allowance_remaining, b.total) == (90, 5_000, 5_090)
    assert b.period_resets_at == datetime(2026, 3, 1, tzinfo=UTC)
    dec = balance(store.engine, a.id, now=datetime(2026, 12, 31, tzinfo=UTC))
    assert dec.period_resets_at == datetime(2027, 1, 1, tzinfo=UTC)


def test_enterprise_has_no_allowance_only_prepaid(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="enterprise")
    b = balance(store.engine, a.id)
    assert (b.prepaid, b.allowance_remaining, b.allowance, b.period_resets_at) == (
        100,
        0,
        None,
        None,
    )
    assert charge(store.engine, a.id, 100, reason="all")
    assert not charge(store.engine, a.id, 1, reason="one more")


def test_short_charge_writes_nothing(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="free")
    before = balance(store.engine, a.id, now=DAY)
    rows_before = _ledger_count(store, a.id)
    assert not charge(store.engine, a.id, 126, reason="too much", now=DAY)
    assert not reserve(store.engine, a.id, 126, reason="too much", now=DAY)
    assert balance(store.engine, a.id, now=DAY) == before
    assert _ledger_count(store, a.id) == rows_before
    assert charge(store.engine, a.id, 125, reason="exactly all", now=DAY)
    assert balance(store.engine, a.id, now=DAY).total == 0


def test_zero_charge_is_a_noop_and_negative_is_refused(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings)
    rows = _ledger_count(store, a.id)
    assert charge(store.engine, a.id, 0, reason="nothing")
    assert _ledger_count(store, a.id) == rows
    with pytest.raises(ValueError):
        charge(store.engine, a.id, -1, reason="sneaky")
    with pytest.raises(ValueError):
        grant(store.engine, a.id, 0, reason="nothing")
    with pytest.raises(AccountNotFound):
        charge(store.engine, 999, 1, reason="ghost")


def test_a_refund_returns_to_the_pool_that_paid(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="free")
    assert reserve(store.engine, a.id, 30, reason="bulk", reference="job:1", now=DAY)
    b = refund(store.engine, a.id, 10, reason="rows not done", reference="job:1", now=DAY)
    # Today's allowance paid 25 of the 30: it takes back first, then prepaid.
    assert (b.prepaid, b.allowance_remaining) == (95, 10)
    b = refund(store.engine, a.id, 20, reason="job failed", reference="job:1", now=DAY)
    assert (b.prepaid, b.allowance_remaining) == (100, 25)  # all of it back where it was
    b = grant(store.engine, a.id, 1_000, reason="purchase", now=DAY)
    assert (b.prepaid, b.total) == (1_100, 1_125)
    kinds = [(e.kind, e.source, e.delta, e.reference) for e in ledger(store.engine, a.id)][:6]
    assert kinds == [
        ("grant", "prepaid", 1_000, None),
        ("refund", "prepaid", 5, "job:1"),
        ("refund", "allowance", 15, "job:1"),
        ("refund", "allowance", 10, "job:1"),
        ("reserve", "prepaid", -5, "job:1"),
        ("reserve", "allowance", -25, "job:1"),
    ]
    assert len(ledger(store.engine, a.id, limit=2, offset=1)) == 2
    _assert_consistent(store, a.id)


def test_a_refund_never_turns_allowance_into_prepaid_credits(store: Store) -> None:
    """A Free account whose work fails (a job refused late, a client hanging up mid-request)
    got its allowance back as prepaid credits, which never lapse: 25 more every day. Now
    only allowance of a period that has ended comes back as prepaid (so none is lost)."""
    a = acc.create_account(store.engine, store.settings, plan="free")
    assert charge(store.engine, a.id, 25, reason="single", reference="request:a", now=DAY)
    b = refund(store.engine, a.id, 25, reason="failed", reference="request:a", now=DAY)
    assert (b.prepaid, b.allowance_remaining, b.total) == (100, 25, 125)
    # Charged today, refunded tomorrow: today's allowance has lapsed, so prepaid it is.
    assert charge(store.engine, a.id, 20, reason="bulk", reference="job:7", now=DAY)
    tomorrow = DAY + timedelta(days=1)
    b = refund(store.engine, a.id, 20, reason="failed", reference="job:7", now=tomorrow)
    assert (b.prepaid, b.allowance_remaining) == (120, 25)
    # Another reference's allowance, or none, is not this refund's to take back.
    assert charge(store.engine, a.id, 5, reason="single", reference="request:b", now=tomorrow)
    b = refund(store.engine, a.id, 3, reason="failed", reference="request:c", now=tomorrow)
    assert (b.prepaid, b.allowance_remaining) == (123, 20)
    b = refund(store.engine, a.id, 2, reason="failed", now=tomorrow)
    assert (b.prepaid, b.allowance_remaining) == (125, 20)
    _assert_consistent(store, a.id)


def test_concurrent_charges_never_overdraw(store20: Store) -> None:
    store = store20
    a = acc.create_account(store.engine, store.settings, plan="enterprise")
    assert balance(store.engine, a.id).total == 20
    barrier = threading.Barrier(50)

    def one(i: int) -> bool:
        barrier.wait()
        return charge(store.engine, a.id, 1, reason="race", reference=f"single:{i}")

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50)))
    assert results.count(True) == 20
    assert balance(store.engine, a.id).total == 0
    charges = [e for e in ledger(store.engine, a.id, limit=100) if e.kind == "charge"]
    assert len(charges) == 20 and sum(e.delta for e in charges) == -20
    assert sorted(e.balance_after for e in charges) == list(range(20))  # each step seen once
    _assert_consistent(store, a.id)


def test_concurrent_charges_across_allowance_and_prepaid(store20: Store) -> None:
    store = store20
    a = acc.create_account(store.engine, store.settings, plan="free")
    barrier = threading.Barrier(60)

    def one(_: int) -> bool:
        barrier.wait()
        return charge(store.engine, a.id, 1, reason="race", now=DAY)

    with ThreadPoolExecutor(max_workers=60) as pool:
        results = list(pool.map(one, range(60)))
    assert results.count(True) == 45  # 25 allowance + 20 prepaid
    b = balance(store.engine, a.id, now=DAY)
    assert (b.prepaid, b.allowance_remaining) == (0, 0)
    entries = ledger(store.engine, a.id, limit=200)
    assert sum(1 for e in entries if e.kind == "allowance") == 1  # period opened once
    assert sum(e.delta for e in entries if e.source == "allowance" and e.kind == "charge") == -25
    _assert_consistent(store, a.id)


_CHARGER = textwrap.dedent(
    """
    import sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from verimail.config import Settings
    from verimail.store.billing.movements import charge
    from verimail.store.db import make_engine

    url, account_id, attempts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start_at = float(sys.argv[4])
    engine = make_engine(Settings(database_url=url))
    engine.connect().close()  # connect before the start line, so both processes race
    barrier = threading.Barrier(attempts)

    def one(i):
        barrier.wait()
        return charge(engine, account_id, 1, reason="process race", reference=f"p:{i}")

    time.sleep(max(0.0, start_at - time.time()))
    with ThreadPoolExecutor(max_workers=attempts) as pool:
        print(sum(pool.map(one, range(attempts))))
    """
)


def test_charges_from_two_processes_never_overdraw(store20: Store) -> None:
    store = store20
    a = acc.create_account(store.engine, store.settings, plan="enterprise")
    url = store.engine.url.render_as_string(hide_password=False)
    start_at = time.time() + 3.0  # both interpreters are up and connected by then
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHARGER, url, str(a.id), "25", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    successes = [int(out.strip()) for out, _ in outputs]
    assert sum(successes) == 20, successes
    assert balance(store.engine, a.id).total == 0
    charges = [e for e in ledger(store.engine, a.id, limit=100) if e.kind == "charge"]
    assert len(charges) == 20 and sum(e.delta for e in charges) == -20
    _assert_consistent(store, a.id)


def test_a_lagging_clock_never_reopens_an_allowance_period(store: Store) -> None:
    a = acc.create_account(store.engine, store.settings, plan="free")
    next_day = datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC)
    assert charge(store.engine, a.id, 25, reason="fast host", now=next_day)
    lagging = datetime(2026, 3, 10, 23, 59, 59, tzinfo=UTC)
    assert balance(store.engine, a.id, now=lagging).allowance_remaining == 0
    assert charge(store.engine, a.id, 1, reason="slow host", now=lagging)
    b = balance(store.engine, a.id, now=next_day)
    assert (b.prepaid, b.allowance_remaining) == (99, 0)


def test_charge_once_pays_each_reference_once(store20: Store) -> None:
    """What a resumed finder job relies on: a second charge under a reference it already
    paid is not made, even from another thread at the same time; being short writes
    nothing; charges_under reads back what each reference cost."""
    a = acc.create_account(store20.engine, store20.settings, plan="enterprise")
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(
            pool.map(
                lambda _: charge_once(store20.engine, a.id, 5, reference="job:1:row:0"),
                range(4),
            )
        )
    assert sorted(outcomes) == ["already"] * 3 + ["charged"]
    assert charge_once(store20.engine, a.id, 5, reference="job:1:row:1") == "charged"
    assert charge_once(store20.engine, a.id, 5, reference="job:10:row:0") == "charged"
    before = _ledger_count(store20, a.id)
    assert charge_once(store20.engine, a.id, 50, reference="job:1:row:2") == "short"
    assert _ledger_count(store20, a.id) == before
    assert charges_under(store20.engine, a.id, "job:1:row:") == {
        "job:1:row:0": 5,
        "job:1:row:1": 5,
    }
    assert balance(store20.engine, a.id).total == 5
    _assert_consistent(store20, a.id)


def test_refund_once_gives_a_reference_back_once(store20: Store) -> None:
    """A resumed finder run that no longer finds a paid row refunds it: once, however often
    it is asked; the reference then counts as unpaid (charges_under leaves it out, and
    charge_once charges it again); other references are untouched."""
    a = acc.create_account(store20.engine, store20.settings, plan="enterprise")
    for row in (0, 1):
        assert charge_once(store20.engine, a.id, 5, reference=f"job:1:row:{row}") == "charged"
    assert refund_once(store20.engine, a.id, reference="job:1:row:0", reason="gone") == 5
    assert refund_once(store20.engine, a.id, reference="job:1:row:0", reason="gone") == 0
    assert refund_once(store20.engine, a.id, reference="job:1:row:9", reason="never") == 0
    assert charges_under(store20.engine, a.id, "job:1:row:") == {"job:1:row:1": 5}
    assert balance(store20.engine, a.id).total == 15
    assert charge_once(store20.engine, a.id, 5, reference="job:1:row:0") == "charged"
    assert charge_once(store20.engine, a.id, 5, reference="job:1:row:0") == "already"
    assert balance(store20.engine, a.id).total == 10
    _assert_consistent(store20, a.id)
