"""``/metrics`` for operators: off without a token, refused without it, and after a small
bulk job every family named in docs/metrics.md has moved.

The engine's counters are per process (other tests in this process count too), so the job's
effect is read as the difference between a scrape before and one after it.
"""

from __future__ import annotations

import pytest
from api_helpers import assert_error_body, poll_job, running_app
from prometheus_client.parser import text_string_to_metric_families

from verimail.store import jobs as job_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

TOKEN = "metrics-token-for-the-test-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UPLOAD = "email\nalice@acme.test\nnobody@acme.test\nalice@acme.test\nsomeone@down.test\n"


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx.down.test", HostBehaviour(refuse_connections=True)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("down.test", mx=[(10, "mx.down.test")]),
        ],
    )


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


async def test_no_token_no_metrics_endpoint(testbed_factory, testbed_settings, tmp_path):
    settings = testbed_settings(testbed_factory(_world()), tmp_path, prefect_warm_up=False)
    async with running_app(settings) as api:
        assert (await api.client.get("/metrics", headers=AUTH)).status_code == 404


async def test_metrics_after_a_small_job(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(_world())
    settings = testbed_settings(tb, tmp_path, metrics_token=TOKEN, prefect_warm_up=False)
    async with running_app(settings) as api:
        customer = api.customer(credits=100)
        detail = assert_error_body(await api.client.get("/metrics"), 401)
        assert "token" in detail
        wrong = {"Authorization": "Bearer not-the-token"}
        assert (await api.client.get("/metrics", headers=wrong)).status_code == 401

        before = _samples((await api.client.get("/metrics", headers=AUTH)).text)
        created = await api.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("list.csv", UPLOAD.encode(), "text/csv")},
        )
        assert created.status_code == 200, created.text
        job_id = created.json()["job_id"]
        done = await poll_job(api.client, f"/api/bulk/{job_id}", customer.headers)
        assert done["status"] == "completed", done
        # A job that fails gives its reservation back (a refund in the ledger).
        failing = job_store.create_job(
            api.store.engine, customer.account_id, "bulk_csv", 2, reserve=2
        )
        assert failing is not None and job_store.mark_processing(api.store.engine, failing.id)
        assert job_store.mark_failed(
            api.store.engine, failing.id, "The job stopped.", job_store.UNVERIFIED
        )
        scrape = await api.client.get("/metrics", headers=AUTH)
        assert scrape.status_code == 200
        assert scrape.headers["content-type"].startswith("text/plain")
        after = _samples(scrape.text)

    def grew(name: str, **labels: str) -> float:
        return _total(after, name, **labels) - _total(before, name, **labels)

    # HTTP requests, counted by route template, and their latency.
    assert grew("http_requests_total", handler="/api/bulk", method="POST", status="200") == 1
    assert grew("http_requests_total", handler="/api/bulk/{job_id}", method="GET") >= 1
    assert grew("http_request_duration_seconds_count", handler="/api/bulk") == 1
    assert _total(after, "http_requests_total", handler="/metrics") == 0  # (not itself)
    # The engine: verifications by status, SMTP sessions, DNS queries.
    assert grew("verimail_verifications_total", status="valid") >= 1
    assert grew("verimail_verifications_total", status="invalid") >= 1
    assert grew("verimail_smtp_sessions_opened_total") >= 1
    assert grew("verimail_smtp_sessions_refused_total", reason="connection_failed") >= 1
    assert grew("verimail_dns_queries_total", type="MX") >= 1
    # Jobs by state and queue wait; credits charged and refunded (from the database).
    assert _total(after, "verimail_jobs", kind="bulk_csv", status="completed") == 1
    assert _total(after, "verimail_jobs", kind="bulk_csv", status="failed") == 1
    assert _total(after, "verimail_jobs", kind="bulk_csv", status="processing") == 0
    assert grew("verimail_job_queue_wait_seconds_count", kind="bulk_csv") == 1
    assert _total(after, "verimail_credits_charged_total") == 4 + 2  # (the two reservations)
    assert _total(after, "verimail_credits_refunded_total") == 2  # (the failed job's)
