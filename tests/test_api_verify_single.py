"""``POST /api/verify/single`` against the loopback testbed: verdicts, credits, 401/402/422,
and the error body shape everywhere (including Starlette's own 404/405)."""

from __future__ import annotations

import asyncio

import pytest
from api_helpers import (
    RunningApp,
    assert_error_body,
    ledger_size,
    running_app,
    total_balance,
)

from verimail.api.errors import INTERNAL_ERROR
from verimail.engine.smtp.host_slots import HostSlots, host_semaphore
from verimail.store.accounts import list_keys, revoke_key
from verimail.store.billing.ledger import ledger
from verimail.store.billing.pools import balance
from verimail.testbed.server import Testbed

SINGLE = "/api/verify/single"
RESULT_FIELDS = {
    "email": str,
    "safe_to_send": bool,
    "status": str,
    "confidence_score": float,
    "reason": str,
    "domain": str,
    "is_disposable": bool,
    "is_role_based": bool,
    "is_free": bool,
    "is_catch_all": bool,
    "mx_records": list,
    "verification_time_ms": int,
    "api_version": str,
    "sub_status": str,
}


async def test_valid_invalid_and_catch_all_cost_one_credit_each(api: RunningApp) -> None:
    customer = api.customer(credits=10)

    valid = await api.client.post(
        SINGLE, json={"email": "alice@acme.test"}, headers=customer.headers
    )
    assert valid.status_code == 200, valid.text
    body = valid.json()
    for field, kind in RESULT_FIELDS.items():
        assert isinstance(body[field], kind), (field, body[field])
    assert {"smtp_response", "did_you_mean", "catch_all_score"} <= set(body)
    assert body["status"] == "valid" and body["safe_to_send"] is True
    assert body["email"] == "alice@acme.test" and body["domain"] == "acme.test"
    assert body["mx_records"] == ["mx.acme.test"]
    assert body["api_version"] == "1.0.0"
    assert body["smtp_response"].startswith("250")
    assert total_balance(api.store, customer.account_id) == 9

    invalid = await api.client.post(
        SINGLE, json={"email": "nobody@acme.test"}, headers=customer.headers
    )
    assert invalid.status_code == 200
    assert invalid.json()["status"] == "invalid"
    assert invalid.json()["sub_status"] == "mailbox_not_found"
    assert invalid.json()["safe_to_send"] is False
    assert total_balance(api.store, customer.account_id) == 8

    catch_all = await api.client.post(
        SINGLE, json={"email": "anyone@catchall.test"}, headers=customer.headers
    )
    assert catch_all.status_code == 200
    result = catch_all.json()
    assert result["status"] in ("catchall", "likely_valid")
    assert result["is_catch_all"] is True and isinstance(result["catch_all_score"], int)
    assert total_balance(api.store, customer.account_id) == 7

    charges = [e for e in ledger(api.store.engine, customer.account_id) if e.kind == "charge"]
    assert [e.delta for e in charges] == [-1, -1, -1]


async def test_malformed_address_is_verified_invalid_not_rejected(api: RunningApp) -> None:
    customer = api.customer(credits=5)
    response = await api.client.post(
        SINGLE, json={"email": "not an address"}, headers=customer.headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "invalid" and body["sub_status"] == "invalid_syntax"
    assert body["reason"]
    assert total_balance(api.store, customer.account_id) == 4


async def test_unauthorized_requests_get_401_with_a_bearer_challenge(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=5)
    payload = {"email": "alice@acme.test"}
    cases = {
        "missing": {},
        "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
        "empty bearer": {"Authorization": "Bearer "},
        "two tokens": {"Authorization": f"Bearer {customer.key} extra"},
        "unknown key": {"Authorization": "Bearer vm_" + "x" * 43},
        "not our format": {"Authorization": "Bearer hunter2"},
        "no scheme": {"Authorization": customer.key},
    }
    for name, headers in cases.items():
        response = await api.client.post(SINGLE, json=payload, headers=headers)
        detail = assert_error_body(response, 401)
        assert response.headers["www-authenticate"] == "Bearer", name
        assert "Authorization: Bearer" in detail or "Invalid API key" in detail, detail
    assert "Missing API key" in assert_error_body(await api.client.post(SINGLE, json=payload), 401)
    assert "'Basic'" in assert_error_body(
        await api.client.post(SINGLE, json=payload, headers=cases["basic"]), 401
    )
    # A key sent without "Bearer " is not repeated in the answer (nor would a long scheme be).
    bare = assert_error_body(
        await api.client.post(SINGLE, json=payload, headers=cases["no scheme"]), 401
    )
    assert customer.key not in bare and customer.key[:12] not in bare and "Bearer" in bare
    assert total_balance(api.store, customer.account_id) == 5
    assert tb.total_stats().rcpt_to == 0


async def test_a_revoked_key_stops_working_at_once(api: RunningApp) -> None:
    customer = api.customer(credits=5)
    payload = {"email": "not-an-address"}
    first = await api.client.post(SINGLE, json=payload, headers=customer.headers)
    assert first.status_code == 200
    (key,) = list_keys(api.store.engine, customer.account_id)
    assert revoke_key(api.store.engine, customer.account_id, key.id)
    second = await api.client.post(SINGLE, json=payload, headers=customer.headers)
    assert "revoked" in assert_error_body(second, 401)
    assert second.headers["www-authenticate"] == "Bearer"
    assert total_balance(api.store, customer.account_id) == 4


async def test_402_when_out_of_credits_charges_and_verifies_nothing(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=0)
    before = ledger_size(api.store, customer.account_id)
    response = await api.client.post(
        SINGLE, json={"email": "alice@acme.test"}, headers=customer.headers
    )
    assert assert_error_body(response, 402) == (
        "Not enough credits: this request needs 1, the balance is 0."
    )
    assert ledger_size(api.store, customer.account_id) == before
    assert total_balance(api.store, customer.account_id) == 0
    assert tb.total_stats().sessions == 0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"json": {}}, "email: field required"),
        ({"json": {"mail": "alice@acme.test"}}, "email: field required"),
        ({"json": {"email": 123}}, "email: must be a string"),
        ({"json": {"email": None}}, "email: must be a string"),
        ({"json": {"email": ["alice@acme.test"]}}, "email: must be a string"),
        ({"json": {"email": "a" * 310 + "@acme.test1"}}, "email: at most 320 characters"),
        ({"json": ["alice@acme.test"]}, "request body must be a JSON object"),
        (
            {
                "content": b'{"email": "alice@acme.test"',
                "headers": {"content-type": "application/json"},
            },
            "request body is not valid JSON",
        ),
        ({"content": b""}, "request body required"),
        (
            {"content": b'{"email": "\xff"}', "headers": {"content-type": "application/json"}},
            "request body could not be read as JSON (it must be UTF-8",
        ),
        (  # (valid UTF-8 JSON, too deep for the parser: it was blamed on the encoding)
            {"content": b"[" * 100_000, "headers": {"content-type": "application/json"}},
            "request body could not be read as JSON (it must be UTF-8, not nested too deeply)",
        ),
    ],
)
async def test_invalid_bodies_get_a_readable_422(
    api: RunningApp, kwargs: dict, expected: str
) -> None:
    customer = api.customer(credits=5)
    headers = {**customer.headers, **kwargs.pop("headers", {})}
    response = await api.client.post(SINGLE, headers=headers, **kwargs)
    detail = assert_error_body(response, 422)
    assert detail.startswith(expected), detail
    errors = response.json()["errors"]
    assert errors and all({"type", "loc", "msg"} <= set(e) for e in errors)
    assert total_balance(api.store, customer.account_id) == 5


async def test_router_errors_use_the_same_body(api: RunningApp) -> None:
    missing = await api.client.get("/api/nothing-here")
    assert "/api/nothing-here" in assert_error_body(missing, 404)

    wrong_method = await api.client.get(SINGLE)
    detail = assert_error_body(wrong_method, 405)
    assert "GET" in detail and "POST" in detail
    assert wrong_method.headers["allow"] == "POST"

    # A path several routes serve (GET, PUT and DELETE of one resource): Allow names them
    # all, not only the first route Starlette matched.
    schedule = await api.client.post("/api/bulk/1/reverify-schedule")
    detail = assert_error_body(schedule, 405)
    assert set(schedule.headers["allow"].split(", ")) == {"DELETE", "GET", "PUT"}
    assert "use DELETE, GET, PUT" in detail


async def test_a_crash_while_verifying_is_a_plain_500_and_refunds(
    tb, tmp_path, testbed_settings, monkeypatch
) -> None:
    """Fault injection: the engine raises mid-request (a bug we do not have, simulated)."""
    async with running_app(testbed_settings(tb, tmp_path), raise_app_exceptions=False) as api:
        customer = api.customer(credits=3)

        async def broken(*args, **kwargs):
            raise RuntimeError("simulated engine bug")

        monkeypatch.setattr(api.app.state.engine, "verify_many", broken)
        for path, payload in (
            (SINGLE, {"email": "alice@acme.test"}),
            ("/api/verify/batch", {"emails": ["alice@acme.test", "bob@acme.test"]}),
        ):
            response = await api.client.post(path, json=payload, headers=customer.headers)
            assert assert_error_body(response, 500) == INTERNAL_ERROR
            assert "Traceback" not in response.text and "simulated" not in response.text
            assert total_balance(api.store, customer.account_id) == 3
        kinds = [e.kind for e in reversed(ledger(api.store.engine, customer.account_id))]
        assert kinds == ["signup", "charge", "refund", "charge", "refund"]
        # A Free account's allowance comes back as allowance, not as prepaid credits that
        # never lapse (which a client hanging up mid-request could farm every day).
        free = api.customer(plan="free", credits=0)
        response = await api.client.post(
            SINGLE, json={"email": "a@acme.test"}, headers=free.headers
        )
        assert response.status_code == 500
        after = balance(api.store.engine, free.account_id)
        assert (after.prepaid, after.allowance_remaining) == (0, 25)


async def test_a_request_goes_before_a_jobs_queued_session(tb, tmp_path, testbed_settings) -> None:
    """The mail host's one slot is taken (a job's session) and another job session queues
    for it; a single verification, whose client is waiting, gets the slot first when it
    frees, and the job's session after it."""
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1)
    job_slots = HostSlots(1, 200, None)
    async with running_app(settings) as running:
        customer = running.customer(credits=10)
        server = tb.address_of("mx.acme.test")  # (slots are per server address)
        held = await job_slots.take(server)
        queued = asyncio.create_task(job_slots.take(server))
        # What the host had seen when the job's session got its slot:
        seen: list[int] = []
        queued.add_done_callback(lambda _: seen.append(tb.host_stats("mx.acme.test").rcpt_to))
        request = asyncio.create_task(
            running.client.post(SINGLE, json={"email": "alice@acme.test"}, headers=customer.headers)
        )
        sem = host_semaphore(server, 1)
        assert sem is not None
        while sem.waiting < 2:  # the job's session, then the request's
            await asyncio.sleep(0.005)
        held.release()
        answer = await asyncio.wait_for(request, 30)
        assert answer.status_code == 200 and answer.json()["status"] == "valid"
        (await asyncio.wait_for(queued, 30)).release()
        assert seen[0] >= 1  # the request's RCPT had been answered: it went first
