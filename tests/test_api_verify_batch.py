"""``POST /api/verify/batch``: input order, duplicates charged but probed once, summary,
size limits and the all-or-nothing charge."""

from __future__ import annotations

import pytest
from api_helpers import (
    RunningApp,
    assert_error_body,
    ledger_size,
    total_balance,
)

from verimail.testbed.server import Testbed

BATCH = "/api/verify/batch"


async def test_results_in_input_order_duplicates_charged_but_probed_once(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=20)
    emails = [
        "nobody@acme.test",
        "alice@acme.test",
        "anyone@catchall.test",
        "alice@acme.test",
        "not-an-address",
        "bob@acme.test",
        "alice@acme.test",
    ]
    response = await api.client.post(BATCH, json={"emails": emails}, headers=customer.headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"results", "credits_used", "summary"}
    assert [r["email"] for r in body["results"]] == emails
    statuses = [r["status"] for r in body["results"]]
    assert statuses[0] == "invalid"
    assert statuses[1] == statuses[3] == statuses[6] == statuses[5] == "valid"
    assert statuses[2] in ("catchall", "likely_valid")
    assert statuses[4] == "invalid" and body["results"][4]["sub_status"] == "invalid_syntax"
    for result in body["results"]:
        assert result["api_version"] == "1.0.0"
        assert isinstance(result["verification_time_ms"], int)

    assert body["credits_used"] == len(emails)
    assert total_balance(api.store, customer.account_id) == 20 - len(emails)

    rcpts = tb.host_stats("mx.acme.test").rcpts
    assert rcpts.count("alice@acme.test") == 1, rcpts
    assert rcpts.count("bob@acme.test") == 1 and rcpts.count("nobody@acme.test") == 1

    summary = body["summary"]
    assert set(summary) == {
        "valid",
        "invalid",
        "disposable",
        "catchall",
        "unknown",
        "likely_valid",
        "risky",
    }
    assert sum(summary.values()) == len(emails)
    assert summary["valid"] == 4 and summary["invalid"] == 2
    assert summary["catchall"] + summary["likely_valid"] == 1


@pytest.mark.parametrize(
    ("emails", "expected"),
    [
        ([], "emails: at least 1 address"),
        (["x@acme.test"] * 501, "emails: at most 500 addresses per request"),
        (["a@acme.test", 7], "emails[1]: must be a string"),
        ("alice@acme.test", "emails: must be a JSON array of strings"),
        (["a" * 321], "emails[0]: at most 320 characters"),
        (
            [1] * 8,
            "; ".join(f"emails[{i}]: must be a string" for i in range(5))
            + "; and 3 more (see `errors`)",
        ),
    ],
)
async def test_bad_batches_get_422_and_cost_nothing(
    api: RunningApp, tb: Testbed, emails: object, expected: str
) -> None:
    customer = api.customer(credits=1000)
    response = await api.client.post(BATCH, json={"emails": emails}, headers=customer.headers)
    assert assert_error_body(response, 422) == expected
    assert total_balance(api.store, customer.account_id) == 1000
    assert tb.total_stats().sessions == 0


async def test_500_addresses_are_accepted(api: RunningApp) -> None:
    customer = api.customer(credits=500)
    emails = [f"user{i}@nowhere.test" for i in range(500)]
    response = await api.client.post(BATCH, json={"emails": emails}, headers=customer.headers)
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 500
    assert total_balance(api.store, customer.account_id) == 0


async def test_402_when_short_charges_and_verifies_nothing(api: RunningApp, tb: Testbed) -> None:
    customer = api.customer(credits=3)
    before = ledger_size(api.store, customer.account_id)
    emails = ["alice@acme.test", "bob@acme.test", "nobody@acme.test", "info@acme.test", "x@y.z"]
    response = await api.client.post(BATCH, json={"emails": emails}, headers=customer.headers)
    assert assert_error_body(response, 402) == (
        "Not enough credits: this request needs 5, the balance is 3."
    )
    assert ledger_size(api.store, customer.account_id) == before
    assert total_balance(api.store, customer.account_id) == 3
    assert tb.total_stats().sessions == 0
    assert not tb.dns_queries
