"""Learned domain patterns over HTTP: ``POST /api/find-email`` teaches and uses them,
``GET /api/domain-pattern`` shows them for free (issue 26)."""

from __future__ import annotations

import pytest
from api_helpers import RunningApp, assert_error_body, running_app, total_balance

from verimail.api.routes.finder import FINDER_DISABLED
from verimail.store.accounts import set_finder
from verimail.testbed.people import company, finder_world
from verimail.testbed.server import Testbed

PATTERN = "/api/domain-pattern"
PEOPLE = company("lastf.test", "last.f", 4)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(finder_world(PEOPLE))


async def _find(api: RunningApp, headers: dict[str, str], index: int) -> dict:
    person = PEOPLE[index]
    body = {"first_name": person.first, "last_name": person.last, "domain": "lastf.test"}
    response = await api.client.post("/api/find-email", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def test_finds_teach_the_pattern_and_the_next_find_costs_one_candidate(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=100)
    empty = await api.client.get(PATTERN, params={"domain": "lastf.test"}, headers=customer.headers)
    assert empty.status_code == 200, empty.text
    assert empty.json() == {
        "domain": "lastf.test", "pattern": None, "confidence": 0.0, "finds": 0,
        "total_finds": 0, "scope": "all", "patterns": [],
    }  # fmt: skip

    first = await _find(api, customer.headers, 0)
    assert (first["email"], first["pattern"]) == (PEOPLE[0].email, "last.f")
    before = tb.host_stats("mx.lastf.test").rcpt_to
    second = await _find(api, customer.headers, 1)
    assert second["email"] == PEOPLE[1].email
    assert tb.host_stats("mx.lastf.test").rcpt_to - before == 2  # the probe, then last.f
    assert second["confidence"] > first["confidence"]

    balance = total_balance(api.store, customer.account_id)
    learned = await api.client.get(
        PATTERN, params={"domain": "https://www.LastF.test/team"}, headers=customer.headers
    )
    assert learned.status_code == 200, learned.text
    body = learned.json()
    assert (body["domain"], body["pattern"], body["finds"], body["total_finds"]) == (
        "lastf.test", "last.f", 2, 2,
    )  # fmt: skip
    assert body["confidence"] == 0.67
    assert body["patterns"] == [{"pattern": "last.f", "finds": 2, "confidence": 0.67}]
    assert total_balance(api.store, customer.account_id) == balance  # free
    assert "@" not in learned.text  # pattern names and counts, never an address


async def test_with_scope_all_another_account_benefits(api: RunningApp, tb: Testbed) -> None:
    teacher, newcomer = api.customer(credits=100), api.customer(credits=100)
    await _find(api, teacher.headers, 0)
    before = tb.host_stats("mx.lastf.test").rcpt_to
    found = await _find(api, newcomer.headers, 2)
    assert found["email"] == PEOPLE[2].email
    assert tb.host_stats("mx.lastf.test").rcpt_to - before == 2
    seen = await api.client.get(PATTERN, params={"domain": "lastf.test"}, headers=newcomer.headers)
    assert seen.json()["finds"] == 2


async def test_with_scope_account_only_the_account_benefits(
    tb: Testbed, tmp_path, testbed_settings
) -> None:
    settings = testbed_settings(tb, tmp_path, finder_pattern_scope="account")
    async with running_app(settings) as api:
        teacher, newcomer = api.customer(credits=100), api.customer(credits=100)
        await _find(api, teacher.headers, 0)
        before = tb.host_stats("mx.lastf.test").rcpt_to
        await _find(api, newcomer.headers, 1)
        assert tb.host_stats("mx.lastf.test").rcpt_to - before > 2  # walked the candidates
        mine = await api.client.get(
            PATTERN, params={"domain": "lastf.test"}, headers=teacher.headers
        )
        assert (mine.json()["scope"], mine.json()["finds"]) == ("account", 1)


async def test_refusals(api: RunningApp) -> None:
    customer = api.customer(credits=0)
    assert (await api.client.get(PATTERN, params={"domain": "lastf.test"})).status_code == 401
    for bad in ("10.0.0.1", "not a domain", "localhost"):
        response = await api.client.get(PATTERN, params={"domain": bad}, headers=customer.headers)
        assert response.status_code == 422, (bad, response.text)
    missing = await api.client.get(PATTERN, headers=customer.headers)
    assert missing.status_code == 422
    free = await api.client.get(PATTERN, params={"domain": "lastf.test"}, headers=customer.headers)
    assert free.status_code == 200  # no credits needed
    set_finder(api.store.engine, customer.account_id, False)
    off = await api.client.get(PATTERN, params={"domain": "lastf.test"}, headers=customer.headers)
    assert assert_error_body(off, 403) == FINDER_DISABLED


async def test_the_operation_is_documented(api: RunningApp) -> None:
    operation = (await api.client.get("/openapi.json")).json()["paths"][PATTERN]["get"]
    assert operation["summary"] and "Free of charge" in operation["description"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/DomainPatternResponse")
