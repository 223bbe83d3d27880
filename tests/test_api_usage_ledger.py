"""``GET /api/account/usage`` and ``GET /api/account/ledger`` over HTTP: the per-day figure
the dashboard's chart draws, the ledger by cursor, bad ranges refused in words, and each
account seeing only its own credits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from api_helpers import RunningApp, assert_error_body

from verimail.api.dashboard.insights import USAGE_DAYS
from verimail.store.billing.ledger import daily_spending
from verimail.store.billing.movements import charge, refund
from verimail.store.db import utcnow


async def test_usage_per_day_for_its_owner_only(api: RunningApp) -> None:
    owner, other = api.customer(credits=500), api.customer(credits=500)
    late = datetime(2026, 11, 26, 23, 30, tzinfo=UTC)
    engine = api.store.engine
    charge(engine, owner.account_id, 5, reason="x", now=late)
    charge(engine, owner.account_id, 7, reason="x", now=late + timedelta(hours=1))
    charge(engine, owner.account_id, 3, reason="x", reference="r1", now=late + timedelta(hours=2))
    refund(
        engine, owner.account_id, 3, reason="back", reference="r1", now=late + timedelta(hours=3)
    )
    charge(engine, other.account_id, 50, reason="someone else", now=late)

    params = {"from": "2026-11-25", "to": "2026-11-27", "granularity": "day"}
    response = await api.client.get("/api/account/usage", headers=owner.headers, params=params)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "from": "2026-11-25",
        "to": "2026-11-27",
        "granularity": "day",
        "total_spent": 12,
        "days": [
            {"date": "2026-11-25", "credits_spent": 0},
            {"date": "2026-11-26", "credits_spent": 5},
            {"date": "2026-11-27", "credits_spent": 7},  # (the refund cancels its charge)
        ],
    }
    theirs = await api.client.get("/api/account/usage", headers=other.headers, params=params)
    assert theirs.json()["total_spent"] == 50

    # Without a range: the dashboard's chart, day for day.
    charge(engine, owner.account_id, 4, reason="today")
    default = (await api.client.get("/api/account/usage", headers=owner.headers)).json()
    today = utcnow().date()
    chart = daily_spending(engine, owner.account_id, USAGE_DAYS, today=today)
    assert [d["credits_spent"] for d in default["days"]] == chart
    assert default["to"] == today.isoformat() and len(default["days"]) == USAGE_DAYS
    assert chart[-1] >= 4


async def test_bad_usage_ranges_are_refused_in_words(api: RunningApp) -> None:
    owner = api.customer()
    cases = {
        "from=2026-11-27&to=2026-11-01": "after to",
        "from=2024-01-01&to=2026-01-01": "at most 366 days",
        "from=2026-02-30": "from",
        "to=yesterday": "to",
        "granularity=hour": "granularity",
    }
    for query, words in cases.items():
        response = await api.client.get(f"/api/account/usage?{query}", headers=owner.headers)
        assert words in assert_error_body(response, 422), query
    ok = await api.client.get(
        "/api/account/usage?from=2025-01-01&to=2025-12-31", headers=owner.headers
    )
    assert ok.status_code == 200 and len(ok.json()["days"]) == 365
    assert_error_body(await api.client.get("/api/account/usage"), 401)


async def test_ledger_pages_newest_first_and_only_the_account_rows(api: RunningApp) -> None:
    owner, other = api.customer(credits=100), api.customer(credits=100)
    for n in range(1, 5):
        charge(api.store.engine, owner.account_id, n, reason=f"charge {n}")
    charge(api.store.engine, other.account_id, 9, reason="theirs")

    rows, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = await api.client.get("/api/account/ledger", headers=owner.headers, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["entries"]) <= 2
        rows += body["entries"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [(r["kind"], r["delta"]) for r in rows] == [
        ("charge", -4),
        ("charge", -3),
        ("charge", -2),
        ("charge", -1),
        ("signup", 100),
    ]
    assert rows[0]["balance_after"] == 90 and rows[0]["reason"] == "charge 4"
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    theirs = (await api.client.get("/api/account/ledger", headers=other.headers)).json()
    assert theirs["entries"][0]["reason"] == "theirs"
    assert not {r["id"] for r in theirs["entries"]} & {r["id"] for r in rows}

    for query, words in {"limit=0": "limit", "cursor=bm9wZQ": "cursor"}.items():
        response = await api.client.get(f"/api/account/ledger?{query}", headers=owner.headers)
        assert words in assert_error_body(response, 422), query
    jobs_cursor = "ajo1"  # ("j:5", a cursor of the jobs list)
    response = await api.client.get(
        f"/api/account/ledger?cursor={jobs_cursor}", headers=owner.headers
    )
    assert "cursor" in assert_error_body(response, 422)
    assert_error_body(await api.client.get("/api/account/ledger"), 401)
