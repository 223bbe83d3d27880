"""``GET /api/bulk`` and ``GET /api/find-email/csv`` (the account's jobs, newest first, by
cursor), over HTTP to the app: filters, pages, refusals, and another account's jobs never
among the items."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from api_helpers import RunningApp, assert_error_body

from verimail.store import accounts as acc
from verimail.store import jobs as job_store
from verimail.store.job_list import JobFilter, jobs_page
from verimail.store.testing import temporary_store

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _job(api: RunningApp, account_id: int, kind: str, day: int, status: str = "pending") -> int:
    job = job_store.create_job(
        api.store.engine, account_id, kind, 3, reserve=0, now=T0 + timedelta(days=day)
    )
    assert job is not None
    if status != "pending":
        assert job_store.mark_processing(api.store.engine, job.id)
    if status == "completed":
        assert job_store.mark_completed(api.store.engine, job.id, {"valid": 3}, None, 0)
    if status == "failed":
        assert job_store.mark_failed(api.store.engine, job.id, "gave up")
    return job.id


async def _ids(api: RunningApp, headers: dict[str, str], url: str, **params) -> list:
    response = await api.client.get(url, headers=headers, params=params)
    assert response.status_code == 200, response.text
    key = "job_id"
    return [job[key] for job in response.json()["jobs"]]


async def test_bulk_list_pages_newest_first_and_filters(api: RunningApp) -> None:
    owner, other = api.customer(), api.customer()
    csv1 = _job(api, owner.account_id, "bulk_csv", 0, "completed")
    json1 = _job(api, owner.account_id, "bulk_json", 1, "failed")
    csv2 = _job(api, owner.account_id, "bulk_csv", 2, "processing")
    _job(api, owner.account_id, "finder_csv", 3)  # (a finder job: not a bulk job)
    csv3 = _job(api, owner.account_id, "bulk_csv", 4)
    foreign = _job(api, other.account_id, "bulk_csv", 5)

    assert await _ids(api, owner.headers, "/api/bulk") == [csv3, csv2, json1, csv1]
    assert await _ids(api, other.headers, "/api/bulk") == [foreign]

    # Each item is the job as its poll endpoint gives it.
    page = (await api.client.get("/api/bulk", headers=owner.headers)).json()
    for item in page["jobs"]:
        polled = await api.client.get(f"/api/bulk/{item['job_id']}", headers=owner.headers)
        assert polled.json() == item
    assert page["next_cursor"] is None

    # Pages of two, by cursor, until it is null: every job once, newest first.
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        body = (await api.client.get("/api/bulk", headers=owner.headers, params=params)).json()
        seen += [job["job_id"] for job in body["jobs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [csv3, csv2, json1, csv1]

    # A cursor from another account pages through the caller's own jobs (here: none older
    # than the owner's newest), never the owner's.
    first = (await api.client.get("/api/bulk?limit=1", headers=owner.headers)).json()
    assert await _ids(api, other.headers, "/api/bulk", cursor=first["next_cursor"]) == []

    assert await _ids(api, owner.headers, "/api/bulk", status="completed") == [csv1]
    both = await _ids(api, owner.headers, "/api/bulk", status=["failed", "processing"])
    assert both == [csv2, json1]
    assert await _ids(api, owner.headers, "/api/bulk", kind="bulk_json") == [json1]
    # [created_from, created_to): csv2 was created at 2026-11-03T09:00 UTC exactly.
    window = {"created_from": "2026-11-02", "created_to": "2026-11-03T09:00:00+00:00"}
    assert await _ids(api, owner.headers, "/api/bulk", **window) == [json1]
    window["created_to"] = "2026-11-03T09:00:01Z"
    assert await _ids(api, owner.headers, "/api/bulk", **window) == [csv2, json1]
    # A time with another zone is that instant: 10:00+01:00 is 09:00 UTC.
    assert await _ids(
        api, owner.headers, "/api/bulk", created_from="2026-11-05T10:00:00+01:00"
    ) == [csv3]


async def test_finder_list_shows_only_finder_jobs_of_the_account(api: RunningApp) -> None:
    owner, other = api.customer(), api.customer()
    _job(api, owner.account_id, "bulk_csv", 0)
    first = _job(api, owner.account_id, "finder_csv", 1, "completed")
    second = _job(api, owner.account_id, "finder_csv", 2)
    _job(api, other.account_id, "finder_csv", 3)
    public = {
        job.id: job.public_id
        for job in job_store.list_jobs(api.store.engine, owner.account_id, limit=10)
    }
    listed = await _ids(api, owner.headers, "/api/find-email/csv")
    assert listed == [public[second], public[first]]
    body = (await api.client.get("/api/find-email/csv?limit=1", headers=owner.headers)).json()
    polled = await api.client.get(f"/api/find-email/csv/{public[second]}", headers=owner.headers)
    assert body["jobs"] == [polled.json()]
    rest = await _ids(api, owner.headers, "/api/find-email/csv", cursor=body["next_cursor"])
    assert rest == [public[first]]
    done = await _ids(api, owner.headers, "/api/find-email/csv", status="completed")
    assert done == [public[first]]
    # A cursor of the bulk list is not one of the finder's.
    bulk = (await api.client.get("/api/bulk?limit=1", headers=owner.headers)).json()
    assert bulk["next_cursor"] is None  # (one bulk job: no next page)
    _job(api, owner.account_id, "bulk_csv", 4)
    bulk = (await api.client.get("/api/bulk?limit=1", headers=owner.headers)).json()
    refused = await api.client.get(
        "/api/find-email/csv", headers=owner.headers, params={"cursor": bulk["next_cursor"]}
    )
    assert "cursor" in assert_error_body(refused, 422)


async def test_bad_filters_are_refused_in_words(api: RunningApp) -> None:
    owner = api.customer()
    cases = {
        "status=done": "status",
        "kind=finder_csv": "kind",
        "limit=0": "limit",
        "limit=101": "limit",
        "created_from=yesterday": "created_from",
        "created_from=2026-11-05&created_to=2026-11-01": "must be before created_to",
        "created_from=2026-11-05&created_to=2026-11-05": "must be before created_to",
        "cursor=not-a-cursor": "cursor",
        "created_to=0001-01-01T00:00:00%2B05:00": "out of range",
    }
    for query, words in cases.items():
        detail = assert_error_body(
            await api.client.get(f"/api/bulk?{query}", headers=owner.headers), 422
        )
        assert words in detail, (query, detail)
    assert_error_body(await api.client.get("/api/bulk"), 401)
    assert_error_body(await api.client.get("/api/find-email/csv"), 401)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_store_pages_by_keyset_with_windows_in_utc(backend: str, tmp_path: Path) -> None:
    """The page query on both databases: the creation window compares instants (a time with
    another zone is the same instant), keyset pages do not overlap, accounts stay apart."""
    with temporary_store(backend, tmp_path) as store:
        one = acc.create_account(store.engine, store.settings, plan="enterprise")
        two = acc.create_account(store.engine, store.settings, plan="enterprise")
        ids = []
        for day in range(5):
            job = job_store.create_job(
                store.engine, one.id, "bulk_csv", 1, reserve=0, now=T0 + timedelta(days=day)
            )
            assert job is not None
            ids.append(job.id)
        job_store.create_job(store.engine, two.id, "bulk_csv", 1, reserve=0, now=T0)
        kinds = JobFilter(("bulk_csv",))
        first, after = jobs_page(store.engine, one.id, kinds, limit=3)
        rest, end = jobs_page(store.engine, one.id, kinds, limit=3, before_id=after)
        assert [j.id for j in first + rest] == ids[::-1] and end is None
        paris = timezone(timedelta(hours=1))
        window = JobFilter(
            ("bulk_csv",),
            created_from=datetime(2026, 11, 2, 10, 0, tzinfo=paris),  # 09:00 UTC: included
            created_to=datetime(2026, 11, 4, 9, 0, tzinfo=UTC),  # excluded
        )
        found, _ = jobs_page(store.engine, one.id, window, limit=10)
        assert [j.id for j in found] == [ids[2], ids[1]]
        assert jobs_page(store.engine, two.id, window, limit=10)[0] == []
