"""Completion webhooks: signed, retried, and never sent into private networks."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from api_helpers import (
    PATIENCE,
    Customer,
    RawTcpServer,
    RunningApp,
    api_world,
    assert_error_body,
    running_app,
    total_balance,
)
from sqlalchemy import update

from verimail.config import using_settings
from verimail.jobs.context import forget, store_for
from verimail.jobs.notify import notify_job
from verimail.jobs.recovery import recover_stale_jobs
from verimail.jobs.webhook import deliver, sign
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.store.db import utcnow
from verimail.store.tables import jobs

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]


class Receiver:
    """A real HTTP server on loopback that records POSTs and answers scripted statuses."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses = list(statuses or [])
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook?x=1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def json_bulk(app: RunningApp, customer: Customer, webhook_url: str) -> httpx.Response:
    """``POST /api/verify/bulk`` of one address with ``webhook_url``."""
    return await app.client.post(
        "/api/verify/bulk",
        headers=customer.headers,
        json={"emails": ["alice@acme.test"], "webhook_url": webhook_url},
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


async def test_delivery_is_signed(receiver):
    result = await deliver(receiver.url, {"job_id": 7}, "s3cret", allow_networks=LOOPBACK)
    assert result.delivered and result.attempts == 1
    headers, body = receiver.requests[0]
    assert json.loads(body) == {"job_id": 7}
    timestamp = int(headers["X-Verimail-Timestamp"])
    assert abs(timestamp - time.time()) < 60
    assert headers["X-Verimail-Signature"] == sign("s3cret", timestamp, body)
    assert headers["X-Verimail-Signature"] != sign("other", timestamp, body)


async def test_retries_then_gives_up_or_succeeds():
    with Receiver([503, 200]) as flaky:
        ok = await deliver(flaky.url, {}, "k", allow_networks=LOOPBACK, backoff=0.01)
        assert ok.delivered and ok.attempts == 2
    with Receiver([500, 500, 500]) as down:
        failed = await deliver(down.url, {}, "k", allow_networks=LOOPBACK, backoff=0.01)
        assert not failed.delivered and failed.attempts == 3 and len(down.requests) == 3
    with Receiver([404]) as gone:
        final = await deliver(gone.url, {}, "k", allow_networks=LOOPBACK, backoff=0.01)
        assert not final.delivered and final.attempts == 1  # 4xx is not retried


async def test_private_targets_are_refused_without_a_connection(receiver):
    refused = await deliver(receiver.url, {}, "k")  # loopback not allowed by default
    assert not refused.delivered and "private" in refused.detail
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    assert not (await deliver(by_name, {}, "k")).delivered
    for url in ("http://10.0.0.1/", "http://[::1]/", "http://169.254.169.254/", "ftp://x.test/"):
        assert not (await deliver(url, {}, "k")).delivered
    assert receiver.requests == []


@pytest.mark.usefixtures("prefect_harness")
async def test_json_bulk_job_posts_its_final_state(
    testbed_factory, testbed_settings, tmp_path, receiver
):
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path, webhook_allow_networks=["127.0.0.0/8"])
    async with running_app(settings) as app:
        customer = app.customer()
        created = await json_bulk(app, customer, receiver.url)
        assert created.status_code == 200, created.text
        secret = created.json()["webhook_secret"]
        deadline = time.monotonic() + PATIENCE
        while not receiver.requests:
            assert time.monotonic() < deadline, "no webhook arrived"
            await asyncio.sleep(0.05)
        headers, body = receiver.requests[0]
        payload = json.loads(body)
        assert payload["job_id"] == created.json()["job_id"]
        assert payload["status"] == "completed" and payload["valid_count"] == 1
        assert "webhook_secret" not in body.decode() or payload["webhook_secret"] is None
        assert headers["X-Verimail-Signature"] == sign(
            secret, int(headers["X-Verimail-Timestamp"]), body
        )
        private = await json_bulk(app, customer, "http://10.1.2.3/hook")
        assert "private" in assert_error_body(private, 422)


def test_a_job_the_reaper_fails_posts_its_final_state(
    testbed_factory, testbed_settings, tmp_path, receiver
):
    """A job whose runner died and that is out of attempts is failed by the reaper, not by
    its flow: its webhook still hears of it (status failed, reservation refunded)."""
    tb = testbed_factory(api_world())
    settings = testbed_settings(
        tb,
        tmp_path,
        webhook_allow_networks=["127.0.0.0/8"],
        job_stale_after=1.0,
        job_max_attempts=1,
    )
    store = store_for(settings)
    try:
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        job = job_store.create_job(
            store.engine,
            account.id,
            "bulk_csv",
            3,
            reserve=3,
            upload_path=str(tmp_path / "gone.csv"),
            webhook_url=receiver.url,
            options={"webhook_secret": "s3cret"},
        )
        assert job is not None
        job_store.mark_processing(store.engine, job.id, now=utcnow() - timedelta(minutes=1))

        class NoRunner:
            def submit(
                self, kind: str, job_id: int, attempt: int | None = None, **_: object
            ) -> None:
                raise AssertionError("out of attempts: not resumed")

        assert recover_stale_jobs(settings, NoRunner()) == [(job.id, "failed")]
        deadline = time.monotonic() + PATIENCE
        while not receiver.requests:
            assert time.monotonic() < deadline, "no webhook arrived"
            time.sleep(0.02)
        headers, body = receiver.requests[0]
        payload = json.loads(body)
        assert (payload["job_id"], payload["status"], payload["credits_refunded"]) == (
            job.id,
            "failed",
            3,
        )
        assert headers["X-Verimail-Signature"] == sign(
            "s3cret", int(headers["X-Verimail-Timestamp"]), body
        )
        assert recover_stale_jobs(settings, NoRunner()) == []  # nothing more to tell
    finally:
        forget(settings)


def test_a_webhook_owed_by_a_process_that_died_is_delivered_by_the_reaper(
    testbed_factory, testbed_settings, tmp_path, receiver
):
    """The run completes its job, then its process dies before it delivers the webhook
    (here: no delivery at all). Once the delivery's lease has passed, any process's reaper
    delivers it, once; a webhook its run delivered is never sent again."""
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path, webhook_allow_networks=["127.0.0.0/8"])
    store = store_for(settings)

    class NoRunner:
        def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
            raise AssertionError("nothing to resume")

    def finished_long_ago(secret: str) -> int:
        job = job_store.create_job(
            store.engine, account.id, "bulk_csv", 1, reserve=1, webhook_url=receiver.url,
            options={"webhook_secret": secret},
        )  # fmt: skip
        assert job is not None and job_store.mark_processing(store.engine, job.id)
        assert job_store.mark_completed(store.engine, job.id, {"valid_count": 1}, "/r.csv", 1)
        with store.engine.begin() as conn:  # (it finished ten minutes ago)
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job.id)
                .values(completed_at=utcnow() - timedelta(minutes=10))
            )
        return job.id

    try:
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        delivered = finished_long_ago("one")
        with using_settings(settings):
            assert asyncio.run(notify_job(settings, delivered)).delivered  # its run did it
        orphan = finished_long_ago("two")
        assert recover_stale_jobs(settings, NoRunner()) == [(orphan, "webhook")]
        deadline = time.monotonic() + PATIENCE
        while len(receiver.requests) < 2:
            assert time.monotonic() < deadline, "the owed webhook did not arrive"
            time.sleep(0.02)
        headers, body = receiver.requests[1]
        assert json.loads(body)["job_id"] == orphan
        assert headers["X-Verimail-Signature"] == sign(
            "two", int(headers["X-Verimail-Timestamp"]), body
        )
        assert recover_stale_jobs(settings, NoRunner()) == []  # delivered: owed no more
        assert len(receiver.requests) == 2
    finally:
        forget(settings)


class _RawReceiver(RawTcpServer):
    """Reads the request, then answers with ``head`` and feeds ``count`` copies of ``chunk``
    (pausing ``pause`` seconds between them) for as long as the client reads. ``sent``
    counts the bytes of the chunks it got out; ``done`` is set when it stops."""

    def __init__(self, head: bytes, chunk: bytes, count: int, pause: float = 0.0) -> None:
        self.head, self.chunk, self.count, self.pause = head, chunk, count, pause
        self.sent = 0
        self.done = threading.Event()
        super().__init__()
        self.url = f"http://{self.address}/hook"

    def handle(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(self.head)
            for _ in range(self.count):
                conn.sendall(self.chunk)
                self.sent += len(self.chunk)
                if self.pause:
                    time.sleep(self.pause)
        finally:
            self.done.set()


async def test_a_receiver_that_drips_its_answer_cannot_hold_the_job():
    """The timeout bounds each whole attempt: an answer fed a byte at a time (each socket
    read well within the timeout) is given up on, and deliver() returns."""
    dripping = _RawReceiver(b"HTTP/1.1 200 OK\r\n", b"X", count=10_000, pause=0.1)
    try:
        result = await asyncio.wait_for(  # (a guard against a hang, not a timing figure)
            deliver(dripping.url, {}, "k", allow_networks=LOOPBACK, timeout=0.5, backoff=0.01),
            timeout=60,
        )
    finally:
        dripping.close()
    assert not result.delivered and result.attempts == 3
    assert result.detail == "no answer within 0.5 s"


async def test_the_answer_body_is_not_downloaded():
    """Only the status line and headers are read: a receiver that answers 200 with a huge
    body is delivered to, and the connection is closed without taking that body in."""
    total = 256 << 20
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total
    huge = _RawReceiver(head, b"x" * (1 << 20), count=total >> 20)
    try:
        result = await deliver(huge.url, {}, "k", allow_networks=LOOPBACK, attempts=1)
        assert await asyncio.to_thread(huge.done.wait, 60)
    finally:
        huge.close()
    assert result.delivered and result.status_code == 200
    assert huge.sent < total // 4  # (what the socket buffers took before the hang-up)


async def test_idn_host_is_sent_in_idna_form(receiver, monkeypatch):
    """A webhook URL with a name in another script is accepted and its Host header is the
    name's IDNA (ASCII) form. (The system resolver is pointed at the receiver for that
    name, as a public DNS answer would.)"""
    resolve = socket.getaddrinfo

    def hosts_file(host, *args, **kwargs):
        return resolve("127.0.0.1" if host == "xn--bcher-kva.example" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hosts_file)
    port = receiver.server.server_port
    result = await deliver(
        f"http://bücher.example:{port}/hook", {"job_id": 1}, "k", allow_networks=LOOPBACK
    )
    assert result.delivered
    assert receiver.requests[0][0]["Host"] == f"xn--bcher-kva.example:{port}"


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://93.184.216.34:99999/hook", "invalid port"),
        ("http://93.184.216.34:0x50/hook", "invalid port"),
        ("http://a\u200db.example/hook", "not a valid name"),  # (a zero-width joiner)
        ("http://93.184.216.34:0/hook", "invalid port"),  # (was sent to port 80)
        ("http://a..b.example/hook", "not a valid name"),
        ("http://exa mple.com/hook", "not a valid name"),
        ("http://[::1/hook", "not a valid URL"),  # (these three were 500s)
        ("http://a\x00b.example/hook", "not a valid name"),
        ("http://\u2100.example/hook", "not a valid URL"),  # (℀ normalises to "a/c")
    ],
)
async def test_a_webhook_url_that_could_never_be_called_is_422_at_creation(
    testbed_factory, testbed_settings, tmp_path, url, detail
):
    """The multipart endpoints take the URL as a plain form field: it gets the checks the
    delivery would fail on, before any job exists (nothing stored, nothing charged)."""
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path)
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        response = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("list.csv", b"email\nalice@acme.test\n", "text/csv")},
            data={"webhook_url": url},
        )
        assert detail in assert_error_body(response, 422), url
        assert total_balance(app.store, customer.account_id) == 5


async def test_a_webhook_url_refused_by_the_json_model_reads_as_written(
    testbed_factory, testbed_settings, tmp_path
):
    """Pydantic's message was lower-cased at its first letter: "uRL scheme should be …"."""
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path)) as app:
        customer = app.customer(credits=5)
        response = await json_bulk(app, customer, "ftp://hooks.example/x")
        detail = assert_error_body(response, 422)
        assert detail.startswith("webhook_url: URL scheme should be"), detail


@pytest.mark.parametrize("host", ["mx.acme.test", "localhost", "hooks.localhost"])
async def test_a_webhook_host_name_that_resolves_inside_is_422_at_creation(
    testbed_factory, testbed_settings, tmp_path, host
):
    """Issue 35: a host *name* that resolves to a private or reserved address (here the
    testbed's loopback mail host, or localhost) is refused when the job is created, in the
    words of a literal private address, on every endpoint that takes a webhook; before, the
    job was made and its webhook silently skipped at delivery."""
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path)) as app:
        customer = app.customer(credits=5)
        literal = await json_bulk(app, customer, "http://10.1.2.3/hook")
        expected = assert_error_body(literal, 422)
        url = f"http://{host}:8080/hook"
        answers = [
            await json_bulk(app, customer, url),
            await app.client.post(
                "/api/bulk",
                headers=customer.headers,
                files={"file": ("list.csv", b"email\nalice@acme.test\n", "text/csv")},
                data={"webhook_url": url},
            ),
        ]
        for response in answers:
            assert assert_error_body(response, 422) == expected, response.request.url
        assert total_balance(app.store, customer.account_id) == 5


def _name_from_etc_hosts() -> str:
    """A host name that ``/etc/hosts`` (not DNS) points at a non-public address: this
    machine's own name, as Debian and container runtimes write it there."""
    name = socket.gethostname()
    listed = {
        word.lower()
        for line in Path("/etc/hosts").read_text(encoding="utf-8").splitlines()
        for word in line.split("#", 1)[0].split()[1:]
    }
    addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    if name.lower() not in listed or any(ipaddress.ip_address(a).is_global for a in addresses):
        pytest.skip(f"this machine's name {name!r} is not a private name of /etc/hosts")
    return name


async def test_a_webhook_name_from_etc_hosts_is_422_at_creation(
    testbed_factory, testbed_settings, tmp_path
):
    """Issue 47: the delivery resolves with the system resolver, `/etc/hosts` first; the
    creation check asked DNS only (the testbed's, which does not know the name), so a name
    of `/etc/hosts` pointing inside passed, and was refused only at delivery. The refusal
    names the setting that allows a network of one's own (issue 45)."""
    from verimail.engine import DomainResolver
    from verimail.jobs.webhook import check_url_resolved

    name = _name_from_etc_hosts()
    settings = testbed_settings(testbed_factory(api_world()), tmp_path)
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        response = await json_bulk(app, customer, f"http://{name}:8080/hook")
        detail = assert_error_body(response, 422)
        assert (
            "private or reserved address" in detail and "VERIMAIL_WEBHOOK_ALLOW_NETWORKS" in detail
        )
        assert total_balance(app.store, customer.account_id) == 5
    allowed = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12")]
    await check_url_resolved(f"http://{name}:8080/hook", allowed, DomainResolver(settings))


def test_a_form_webhook_host_name_that_resolves_inside_is_refused(testbed_factory, tmp_path):
    """The Prefect-UI form checks its webhook as the API does."""
    from conftest import make_testbed_settings

    from verimail.jobs.forms import FormError, checked_webhook

    settings = make_testbed_settings(testbed_factory(api_world()), tmp_path)
    with pytest.raises(FormError, match="private or reserved address"):
        checked_webhook(settings, "https://mx.acme.test/hook")
    allowed = settings.model_copy(update={"webhook_allow_networks": LOOPBACK})
    assert checked_webhook(allowed, " https://mx.acme.test/hook ") == "https://mx.acme.test/hook"


@pytest.mark.usefixtures("prefect_harness")
async def test_a_webhook_not_delivered_is_shown_to_its_owner(
    testbed_factory, testbed_settings, tmp_path
):
    """The job JSON says why (``webhook_error``) and so does the dashboard's job page."""
    from test_dashboard import logged_in, make_user

    from verimail.store.accounts import create_api_key

    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path, webhook_allow_networks=["127.0.0.0/8"])
    with Receiver(statuses=[400]) as refusing:
        async with running_app(settings) as app:
            user = make_user(app, "hooks@example.com", credits=5)
            key, _ = create_api_key(app.store.engine, user.id, name="hooks")
            headers = {"Authorization": f"Bearer {key}"}
            created = await app.client.post(
                "/api/verify/bulk",
                headers=headers,
                json={"emails": ["alice@acme.test"], "webhook_url": refusing.url},
            )
            assert created.status_code == 200, created.text
            job_id = created.json()["job_id"]
            assert created.json().get("webhook_error") is None
            deadline = time.monotonic() + PATIENCE
            while (
                job := (await app.client.get(f"/api/verify/bulk/{job_id}", headers=headers)).json()
            )["webhook_error"] is None:
                assert time.monotonic() < deadline, job
                await asyncio.sleep(0.05)
            assert job["status"] == "completed"
            assert job["webhook_error"] == "answered 400"
            await logged_in(app.client, "hooks@example.com")
            page = (await app.client.get(f"/dashboard/jobs/{job_id}")).text
            assert "Webhook not delivered: answered 400" in page
