"""Schema fuzzing: schemathesis generates requests for every operation of ``/openapi.json``
of ``create_app(...)`` and sends them in-process (ASGI) — with a valid key, and with each
kind of bad key. Data that fits the schema and data that does not are both generated, and
every response passes all of schemathesis' checks: no 5xx, a documented status, content type
and headers, a body matching its schema, schema-valid data accepted and invalid data
refused, no endpoint that ignores authentication. Every error body is ``{"detail": str}``
(422 may add ``errors``) and no detail leaks a developer note.

What the schema cannot say is declared in ``FUZZ_CONFIG`` for the acceptance check: a
valid request may still be refused for want of credits (402), and some refusals depend on
meaning rather than shape (a CSV with no email column, a name with no letters, a domain
that is an IP address): 422 on those operations only.

Jobs are created for real (store, credits, uploads) but handed to a recording runner
instead of Prefect: what is fuzzed here is the HTTP layer, and the flows have their own
tests. Examples per operation: ``FUZZ_EXAMPLES`` in CI; the ``slow`` variant takes more
(scaled by ``VERIMAIL_HARDENING_SCALE``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_helpers import RecordingRunner, api_world, make_customer
from hardening_helpers import scaled
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.python import asgi as schemathesis_asgi

from verimail.api import app as app_module
from verimail.api.app import create_app
from verimail.config import Settings
from verimail.engine import dns_facts
from verimail.store.accounts import create_api_key, list_keys, revoke_key
from verimail.store.db import init_store
from verimail.testbed.server import Testbed

# schemathesis' own strategies trip a Hypothesis deprecation warning; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

FUZZ_EXAMPLES = 6
ACCEPTED = ["2xx", "401", "402", "403", "404", "409", "429"]
"""What a schema-valid request may be answered (402: credits are not in the schema)."""
SEMANTIC_422 = {
    "/api/bulk": "an upload that is not a CSV (a PNG), has no email column or no addresses",
    "/api/find-email/csv": "likewise, or no name or domain column",
    "/api/find-email": "a name with no letters; a domain that is an IP address or whose "
    "labels are not a host name's (the schema states its length and the dot it needs)",
    "/api/domain-pattern": "a domain as for /api/find-email",
    "/api/bulk/{job_id}/reverify-schedule": "a first_run_at in the past (schema-valid "
    "date-time, refused by the clock), or more than a year ahead",
    "/api/verify/bulk": "a webhook_url whose host is not a host name (a label over 63 "
    "characters) or resolves to a private address: a `uri` in the schema all the same",
    "/api/bulk/{job_id}/reverify": "a webhook_url as for /api/verify/bulk",
    # (GET /api/bulk and GET /api/find-email/csv share the paths above) the lists' cursor:
    # opaque, so a string of its length that the list did not give; a creation window that
    # is empty (created_from not before created_to) or a time with no UTC equivalent
    "/api/account/ledger": "a cursor the ledger did not give",
    "/api/account/usage": "`from` after `to`, or a range over 366 days",
    "/api/bulk/{job_id}/download": "partial=true with format=parquet or a segment",
}
"""Operations whose 422 can be about meaning, which no schema states: the documented set
(docs/http-limits.md, "The API document")."""
FUZZ_CONFIG = SchemathesisConfig.from_dict(
    {
        # Credentials are the test's own (each kind in turn), not generated ones.
        "generation": {"mode": "all", "with-security-parameters": False},
        "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}},
        "operations": [
            {
                "include-path": path,
                "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}},
            }
            for path in SEMANTIC_422
        ],
    }
)
LEAKS = ("SPEC", "§", ".py")


@dataclass
class FuzzTarget:
    app: Any  # the app, its lifespan started: schemathesis calls it in-process
    keys: dict[str, str | None]  # auth mode -> raw key (None: no header at all)
    runner: RecordingRunner


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    from conftest import make_testbed_settings

    tb = Testbed(api_world()).start()
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    config = make_testbed_settings(tb, tmp, upload_max_bytes=256 * 1024, upload_max_rows=1000)
    store = init_store(config)
    rich = make_customer(store, plan="enterprise", credits=10**9)
    revoked_account = make_customer(store, plan="enterprise", credits=10)
    revoked_key, _ = create_api_key(store.engine, revoked_account.account_id, name="old")
    for info in list_keys(store.engine, revoked_account.account_id):
        revoke_key(store.engine, revoked_account.account_id, info.id)
    store.close()
    runner = RecordingRunner()
    dns_facts.clear_cache()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "make_runner", lambda _settings: runner)
        app = create_app(config, rate_limit_prefix=f"fuzz-{secrets.token_hex(4)}")
        try:
            schemathesis_asgi.get_client(app).__enter__()  # starts the lifespan (kept per app)
            yield FuzzTarget(
                app,
                {
                    "valid": rich.key,
                    "missing": None,
                    "unknown": "vm_" + secrets.token_urlsafe(32),
                    "revoked": revoked_key,
                    "malformed": "not a key at all",
                },
                runner,
            )
        finally:
            schemathesis_asgi.shutdown_lifespans()  # runs the app's shutdown
            tb.stop()
            dns_facts.clear_cache()


# The schema of the app as built (no lifespan needed to render it). Loaded at import, so
# that each operation is its own test; schemathesis' lazy ``from_fixture`` does not work
# with this pytest. The requests go to the fixture's app, which has the same routes.
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi(), config=FUZZ_CONFIG)


def _check_error_body(response) -> None:
    """Every error is ``{"detail": str}`` (422 may carry the structured ``errors`` too)."""
    if response.status_code < 400:
        return
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), (
        response.status_code,
        response.headers,
    )
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("detail"), str) and body["detail"]
    assert set(body) <= {"detail", "errors"}, body
    assert not any(leak in body["detail"] for leak in LEAKS), body["detail"]


def _send(case, target: FuzzTarget, mode: str) -> None:
    """Send ``case`` with the credentials of ``mode`` and check the response.

    The credentials go as explicit headers (not as part of the generated case), so that
    the auth checks know them for the client's own and probe the same operation without
    them, or with others, through the same in-process client."""
    key = target.keys[mode]
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    auth = {}
    if key is not None:
        auth["Authorization"] = f"Bearer {key}" if mode != "malformed" else key
    case.operation.schema.app = target.app  # (parametrize gives each operation its own copy)
    transport = {"app": target.app, "base_url": f"http://{schemathesis_asgi.HOST}"}
    response = case.call(headers=auth, **transport)
    case.validate_response(response, headers=auth, transport_kwargs=transport)  # every check
    _check_error_body(response)
    if mode != "valid" and case.operation.path != "/api/health":
        # Every operation but health needs a key: a bad one is refused, whatever the body
        # (a body that is not even JSON is a 422 first; another method, a 405).
        allowed = {401, 422} | (
            {405} if case.method.upper() != case.operation.method.upper() else set()
        )
        assert response.status_code in allowed, (mode, case.method, response.status_code)


FAST = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@schema.parametrize()
@FAST
def test_fuzz_with_a_valid_key(case, fuzz_target: FuzzTarget) -> None:
    _send(case, fuzz_target, "valid")


@pytest.fixture(params=["missing", "unknown", "revoked", "malformed"])
def bad_key(request: pytest.FixtureRequest) -> str:
    """Each kind of bad credentials: no header, an unknown key, a revoked key, no scheme."""
    return request.param


@schema.parametrize()
@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_with_bad_keys(case, fuzz_target: FuzzTarget, bad_key: str) -> None:
    _send(case, fuzz_target, bad_key)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=scaled(25),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_with_a_valid_key_longer(case, fuzz_target: FuzzTarget) -> None:
    _send(case, fuzz_target, "valid")
