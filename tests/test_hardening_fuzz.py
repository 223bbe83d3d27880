"""Schema fuzzing: schemathesis generates requests for every operation of ``/openapi.json``
of ``create_app(...)`` and sends them in-process (ASGI) — with a valid key, and with each
kind of bad key. Checked for every response: no 5xx, the status is one the operation
documents, the body matches the documented schema and content type, and every error body is
``{"detail": str}`` (422 may add ``errors``).

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

import pytest
import schemathesis
from api_helpers import RecordingRunner, api_world, make_customer
from hardening_helpers import scaled
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi as schemathesis_asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from verimail.api import app as app_module
from verimail.api.app import create_app
from verimail.config import Settings
from verimail.store.accounts import create_api_key, list_keys, revoke_key
from verimail.store.db import init_store
from verimail.tasks import dns_facts
from verimail.testbed.server import Testbed

# schemathesis' own strategies trip a Hypothesis deprecation warning; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

FUZZ_EXAMPLES = 6
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@dataclass
class FuzzTarget:
    client: schemathesis_asgi.ASGIClient  # a requests session that calls the app in-process
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
            client = schemathesis_asgi.get_client(app).__enter__()  # starts the lifespan
            yield FuzzTarget(
                client,
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
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())


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


def _send(case, target: FuzzTarget, mode: str) -> None:
    """Send ``case`` with the credentials of ``mode`` and check the response."""
    key = target.keys[mode]
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}" if mode != "malformed" else key
    case.headers = headers
    response = case.call(session=target.client, base_url=f"http://{schemathesis_asgi.HOST}")
    case.validate_response(response, checks=CHECKS)
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
