"""``POST /api/find-email`` over HTTP (httpx against the ASGI app) and the loopback testbed:
what is charged and when, the order of the refusals, and the error body everywhere."""

from __future__ import annotations

import asyncio

import pytest
from api_helpers import (
    RunningApp,
    assert_error_body,
    ledger_size,
    running_app,
    total_balance,
    wait_until,
)

from verimail.api.routes.finder import FINDER_DISABLED
from verimail.store.accounts import set_finder
from verimail.store.billing.ledger import ledger
from verimail.store.billing.movements import charge
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

FIND = "/api/find-email"
JOHN = {"first_name": "John", "last_name": "Smith"}
SLOW_DELAY = 0.3  # seconds per SMTP reply of mx.slow.test: the window for the race test
RESULT_FIELDS = {
    "found": bool,
    "status": str,
    "confidence": float,
    "elapsed_ms": int,
    "credits_used": int,
    "alternatives": list,
    "reason": str,
}


def _world() -> World:
    return World.of(
        hosts=[
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"john.smith", "info"})),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
            HostSpec("mx.nobody.test", HostBehaviour(mailboxes={"someone"})),
            HostSpec(
                "mx.slow.test", HostBehaviour(mailboxes={"john.smith"}, reply_delay=SLOW_DELAY)
            ),
        ],
        domains=[
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
            DomainSpec("nobody.test", mx=[(10, "mx.nobody.test")]),
            DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
        ],
    )


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(_world())


async def test_found_charges_exactly_the_finder_charge_once(api: RunningApp, tb: Testbed) -> None:
    customer = api.customer(credits=100)
    response = await api.client.post(
        FIND, json={**JOHN, "domain": "acme.test"}, headers=customer.headers
    )

    assert response.status_code == 200, response.text
    body = response.json()
    for field, kind in RESULT_FIELDS.items():
        assert isinstance(body[field], kind), (field, body[field])
    assert body["found"] is True and body["status"] == "found"
    assert body["email"] == "john.smith@acme.test" and body["pattern"] == "first.last"
    assert body["credits_used"] == 10
    assert 0.9 <= body["confidence"] <= 1.0
    assert set(body) == set(RESULT_FIELDS) | {"email", "pattern"}
    assert total_balance(api.store, customer.account_id) == 90
    newest = ledger(api.store.engine, customer.account_id, limit=1)[0]
    assert (newest.kind, newest.delta) == ("charge", -10)
    assert newest.reason == "email finder: john.smith@acme.test"
    assert tb.host_stats("mx.acme.test").sessions == 1


@pytest.mark.parametrize(
    ("domain", "status", "email"),
    [
        ("nobody.test", "not_found", None),
        ("nxdomain.test", "not_found", None),
        ("catchall.test", "catch_all", "john.smith@catchall.test"),
        ("gmail.com", "not_found", None),
    ],
)
async def test_nothing_verified_costs_nothing(
    api: RunningApp, tb: Testbed, domain: str, status: str, email: str | None
) -> None:
    customer = api.customer(credits=10)
    before = ledger_size(api.store, customer.account_id)
    response = await api.client.post(
        FIND, json={**JOHN, "domain": domain}, headers=customer.headers
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == status and body["email"] == email
    assert body["found"] is False and body["credits_used"] == 0
    assert body["reason"]
    if status == "not_found":
        assert body["confidence"] == 0
    else:
        assert 0 < body["confidence"] <= 0.6
        assert tb.host_stats("mx.catchall.test").rcpt_to == 1  # the catch-all probe only
    assert total_balance(api.store, customer.account_id) == 10
    assert ledger_size(api.store, customer.account_id) == before


async def test_role_inbox_is_never_returned(api: RunningApp, tb: Testbed) -> None:
    """acme.test has an ``info`` mailbox; a person called "Info Sales" must not get it."""
    customer = api.customer(credits=100)
    response = await api.client.post(
        FIND,
        json={"first_name": "Info", "last_name": "Sales", "domain": "acme.test"},
        headers=customer.headers,
    )
    body = response.json()
    assert body["status"] == "not_found" and body["email"] is None
    assert body["credits_used"] == 0
    assert not any(r.startswith("info@") for r in tb.host_stats("mx.acme.test").rcpts)
    assert total_balance(api.store, customer.account_id) == 100


async def test_402_below_the_charge_before_any_dns_or_smtp(api: RunningApp, tb: Testbed) -> None:
    customer = api.customer(credits=9)
    response = await api.client.post(
        FIND, json={**JOHN, "domain": "acme.test"}, headers=customer.headers
    )

    detail = assert_error_body(response, 402)
    assert "costs 10" in detail and "balance is 9" in detail
    assert tb.total_stats().sessions == 0
    assert not tb.dns_queries
    assert total_balance(api.store, customer.account_id) == 9


async def test_credits_spent_during_the_lookup_mean_402_and_no_address(
    api: RunningApp, tb: Testbed
) -> None:
    """Balance checked (10 ≥ 10), then another request spends 5 while SMTP runs: the find
    cannot be paid, so the address is withheld and nothing is charged."""
    customer = api.customer(credits=10)
    request = asyncio.create_task(
        api.client.post(FIND, json={**JOHN, "domain": "slow.test"}, headers=customer.headers)
    )
    await wait_until(
        lambda: tb.host_stats("mx.slow.test").sessions >= 1, what="the finder's SMTP session"
    )
    assert await asyncio.to_thread(
        charge, api.store.engine, customer.account_id, 5, reason="another request"
    )
    response = await request

    detail = assert_error_body(response, 402)
    assert "john.smith" not in response.text
    assert "needs 10" in detail
    assert total_balance(api.store, customer.account_id) == 5
    reasons = [e.reason for e in ledger(api.store.engine, customer.account_id)]
    assert not any(r.startswith("email finder") for r in reasons)


async def test_403_when_the_finder_is_disabled(api: RunningApp, tb: Testbed) -> None:
    customer = api.customer(credits=100)
    set_finder(api.store.engine, customer.account_id, False)

    ok_body = await api.client.post(
        FIND, json={**JOHN, "domain": "acme.test"}, headers=customer.headers
    )
    assert assert_error_body(ok_body, 403) == FINDER_DISABLED
    # 403 comes before body validation: a disabled account learns nothing else.
    bad_body = await api.client.post(FIND, json={"first_name": ""}, headers=customer.headers)
    assert assert_error_body(bad_body, 403) == FINDER_DISABLED
    assert tb.total_stats().sessions == 0

    set_finder(api.store.engine, customer.account_id, True)
    again = await api.client.post(
        FIND, json={**JOHN, "domain": "acme.test"}, headers=customer.headers
    )
    assert again.status_code == 200 and again.json()["credits_used"] == 10


async def test_401_before_anything_else(api: RunningApp, tb: Testbed) -> None:
    for headers in ({}, {"Authorization": "Bearer vm_" + "x" * 43}):
        for payload in ({**JOHN, "domain": "acme.test"}, {"first_name": ""}):
            response = await api.client.post(FIND, json=payload, headers=headers)
            assert_error_body(response, 401)
            assert response.headers["www-authenticate"] == "Bearer"
    assert tb.total_stats().sessions == 0


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, "first_name: field required"),
        ({"first_name": "John", "domain": "acme.test"}, "last_name: field required"),
        ({**JOHN}, "domain: field required"),
        ({**JOHN, "first_name": "", "domain": "acme.test"}, "first_name: at least 1 character"),
        ({**JOHN, "last_name": "", "domain": "acme.test"}, "last_name: at least 1 character"),
        ({**JOHN, "first_name": "  ", "domain": "acme.test"}, "first_name: the first name has"),
        ({**JOHN, "last_name": "!!!", "domain": "acme.test"}, "last_name: the last name has"),
        ({**JOHN, "domain": ""}, "domain: at least 1 character"),
        ({**JOHN, "domain": "127.0.0.1"}, "domain: the domain is an IP address"),
        ({**JOHN, "domain": "acme"}, "domain: the domain has no dot"),
        ({**JOHN, "domain": "john@acme.test"}, "domain: give the company domain only"),
        ({**JOHN, "domain": 42}, "domain: must be a string"),
    ],
)
async def test_invalid_bodies_get_a_readable_422(
    api: RunningApp, tb: Testbed, payload: dict, expected: str
) -> None:
    customer = api.customer(credits=100)
    response = await api.client.post(FIND, json=payload, headers=customer.headers)

    detail = assert_error_body(response, 422)
    assert detail.startswith(expected), detail
    assert response.json()["errors"]
    assert tb.total_stats().sessions == 0
    assert total_balance(api.store, customer.account_id) == 100


async def test_configured_charge_is_honoured(tb, tmp_path, testbed_settings) -> None:
    async with running_app(testbed_settings(tb, tmp_path, finder_charge=20)) as api:
        rich = api.customer(credits=100)
        found = await api.client.post(
            FIND, json={**JOHN, "domain": "acme.test"}, headers=rich.headers
        )
        assert found.status_code == 200, found.text
        assert found.json()["credits_used"] == 20
        assert total_balance(api.store, rich.account_id) == 80
        assert ledger(api.store.engine, rich.account_id, limit=1)[0].delta == -20

        short = api.customer(credits=15)  # enough for the default 10, not for 20
        refused = await api.client.post(
            FIND, json={**JOHN, "domain": "acme.test"}, headers=short.headers
        )
        assert "costs 20" in assert_error_body(refused, 402)
        assert total_balance(api.store, short.account_id) == 15


async def test_rate_limit_applies_as_elsewhere(api: RunningApp, tb: Testbed) -> None:
    """The free plan allows 10 requests a minute; refused bodies count, the 11th is a 429."""
    customer = api.customer(plan="free", credits=0)
    for _ in range(10):
        response = await api.client.post(FIND, json={}, headers=customer.headers)
        assert response.status_code == 422
    limited = await api.client.post(FIND, json={}, headers=customer.headers)
    assert_error_body(limited, 429)
    assert int(limited.headers["retry-after"]) >= 1


async def test_openapi_documents_the_endpoint(api: RunningApp) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    operation = spec["paths"][FIND]["post"]
    responses = operation["responses"]
    for status in ("401", "402", "403", "429"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorBody"), status
    assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ValidationErrorBody"
    )
    result = spec["components"]["schemas"]["FindEmailResponse"]
    assert {
        "found",
        "email",
        "status",
        "confidence",
        "elapsed_ms",
        "credits_used",
        "pattern",
        "alternatives",
        "reason",
    } <= set(result["properties"])
    request = spec["components"]["schemas"]["FindEmailRequest"]
    assert set(request["required"]) == {"first_name", "last_name", "domain"}
    assert request["properties"]["first_name"]["minLength"] == 1
