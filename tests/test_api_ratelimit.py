"""Plan limits: requests per minute and requests in flight, in memory and shared via Redis."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from api_helpers import (
    RawTcpServer,
    RunningApp,
    assert_error_body,
    running_app,
    wait_until,
)

from verimail.api.ratelimit import SLOT_LEASE_SECONDS
from verimail.config import Settings
from verimail.testbed.server import Testbed

SINGLE = "/api/verify/single"
OFFLINE = {"email": "not-an-address"}  # verified without any network traffic
SLOW = {"email": "sam@slow.test"}  # every SMTP reply of mx.slow.test is delayed
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def settings(tb, tmp_path, testbed_settings) -> Settings:
    return testbed_settings(tb, tmp_path)


@pytest.fixture
async def api(settings) -> AsyncIterator[RunningApp]:
    async with running_app(settings) as running:
        yield running


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own in the local Redis (skips when Redis is absent)."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} did not answer: {exc}")
    prefix = f"verimail-test-{secrets.token_hex(6)}"
    yield prefix
    for key in client.scan_iter(match=f"*{prefix}*"):
        client.delete(key)
    client.close()


def _retry_after(response) -> int:
    value = int(response.headers["retry-after"])
    assert 1 <= value <= 60, value
    return value


async def test_free_plan_11th_request_in_a_minute_is_429(api: RunningApp) -> None:
    free = api.customer(plan="free")
    for i in range(10):
        response = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
        assert response.status_code == 200, (i, response.text)
    refused = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
    detail = assert_error_body(refused, 429)
    assert "10 requests per minute" in detail
    _retry_after(refused)

    # Counted per account: another free account and unauthenticated calls are unaffected.
    other = api.customer(plan="free")
    assert (await api.client.post(SINGLE, json=OFFLINE, headers=other.headers)).status_code == 200
    for _ in range(15):
        assert (await api.client.get("/api/health")).status_code == 200
    assert (await api.client.post(SINGLE, json=OFFLINE)).status_code == 401


async def test_unlimited_plan_is_not_rate_limited(api: RunningApp) -> None:
    enterprise = api.customer(plan="enterprise", credits=30)
    responses = await asyncio.gather(
        *(api.client.post(SINGLE, json=OFFLINE, headers=enterprise.headers) for _ in range(30))
    )
    assert [r.status_code for r in responses] == [200] * 30


async def test_free_plan_second_concurrent_request_is_429(api: RunningApp, tb: Testbed) -> None:
    free = api.customer(plan="free")
    first = asyncio.create_task(api.client.post(SINGLE, json=SLOW, headers=free.headers))
    await wait_until(
        lambda: tb.host_stats("mx.slow.test").active >= 1, what="the first request's session"
    )
    second = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
    assert "in flight" in assert_error_body(second, 429)
    _retry_after(second)
    done = await first
    assert done.status_code == 200 and done.json()["status"] == "valid"
    # The slot is released with the response: the next request goes through.
    assert (await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)).status_code == 200


async def test_rate_limit_is_shared_between_apps_through_redis(
    tb: Testbed, tmp_path: Path, testbed_settings, redis_prefix: str
) -> None:
    settings = testbed_settings(tb, tmp_path, redis_url=REDIS_URL)
    async with (
        running_app(settings, rate_limit_prefix=redis_prefix) as one,
        running_app(settings, rate_limit_prefix=redis_prefix) as two,
    ):
        assert one.app.state.limiter.backend == "redis"
        free = one.customer(plan="free")
        for i in range(10):
            api = (one, two)[i % 2]
            response = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
            assert response.status_code == 200, (i, response.text)
        for api in (one, two):
            refused = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
            assert_error_body(refused, 429)
            _retry_after(refused)


async def test_concurrency_cap_is_shared_between_apps_through_redis(
    tb: Testbed, tmp_path: Path, testbed_settings, redis_prefix: str
) -> None:
    settings = testbed_settings(tb, tmp_path, redis_url=REDIS_URL)
    async with (
        running_app(settings, rate_limit_prefix=redis_prefix) as one,
        running_app(settings, rate_limit_prefix=redis_prefix) as two,
    ):
        free = one.customer(plan="free")
        first = asyncio.create_task(one.client.post(SINGLE, json=SLOW, headers=free.headers))
        await wait_until(lambda: tb.host_stats("mx.slow.test").active >= 1, what="a session")
        second = await two.client.post(SINGLE, json=OFFLINE, headers=free.headers)
        assert "in flight" in assert_error_body(second, 429)
        # The slot held in Redis carries a lease, so a crashed holder cannot keep it.
        with redis.Redis.from_url(REDIS_URL) as client:
            key = f"{redis_prefix}:concurrency:{free.account_id}"
            assert client.zcard(key) == 1
            assert 0 < client.ttl(key) <= SLOT_LEASE_SECONDS + 1
        assert (await first).status_code == 200
        assert (
            await two.client.post(SINGLE, json=OFFLINE, headers=free.headers)
        ).status_code == 200


async def test_without_redis_each_app_counts_alone(
    tb: Testbed, tmp_path: Path, testbed_settings
) -> None:
    """The default (memory) limiter is per process: documents why Redis exists."""
    settings = testbed_settings(tb, tmp_path)
    async with running_app(settings) as one, running_app(settings) as two:
        assert one.app.state.limiter.backend == "memory"
        free = one.customer(plan="free")
        for _ in range(10):
            assert (
                await one.client.post(SINGLE, json=OFFLINE, headers=free.headers)
            ).status_code == 200
        assert (
            await one.client.post(SINGLE, json=OFFLINE, headers=free.headers)
        ).status_code == 429
        assert (
            await two.client.post(SINGLE, json=OFFLINE, headers=free.headers)
        ).status_code == 200


async def test_slots_left_by_a_crashed_process_expire(
    tb: Testbed, tmp_path: Path, testbed_settings, redis_prefix: str
) -> None:
    """A slot whose lease ran out (its process died without releasing it) frees itself;
    a slot with a live lease (a request running elsewhere) is respected."""
    settings = testbed_settings(tb, tmp_path, redis_url=REDIS_URL)
    async with running_app(settings, rate_limit_prefix=redis_prefix) as api:
        free = api.customer(plan="free")
        key = f"{redis_prefix}:concurrency:{free.account_id}"
        client = redis.Redis.from_url(REDIS_URL)
        try:
            now = client.time()[0]
            client.zadd(key, {"live-request-elsewhere": now + SLOT_LEASE_SECONDS})
            blocked = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
            assert "in flight" in assert_error_body(blocked, 429)

            client.zadd(key, {"live-request-elsewhere": now - 1})  # its lease ran out
            admitted = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
            assert admitted.status_code == 200, admitted.text
            assert client.zcard(key) == 0  # swept, and our own slot released
        finally:
            client.close()


class _SilentRedis(RawTcpServer):
    """Accepts connections and reads what it is sent, but never answers: a Redis that hangs
    (or a network partition that drops the replies)."""

    def __init__(self) -> None:
        self.received = 0
        super().__init__()
        self.url = f"redis://{self.address}/0"

    def handle(self, conn: socket.socket) -> None:
        while chunk := conn.recv(65536):
            self.received += len(chunk)


async def test_a_redis_that_never_answers_neither_blocks_nor_slows_requests(
    tb: Testbed, tmp_path: Path, testbed_settings
) -> None:
    """Limits fail open, and quickly: the first request waits one short deadline for Redis
    and is let through; the next ones do not ask it again for a while (before, each request
    waited out two client timeouts, ~10 s)."""
    silent = _SilentRedis()
    try:
        settings = testbed_settings(tb, tmp_path, redis_url=silent.url)
        async with running_app(settings) as app:
            free = app.customer(plan="free")
            first = await asyncio.wait_for(  # (a guard against a hang, not a timing figure)
                app.client.post(SINGLE, json=OFFLINE, headers=free.headers), timeout=30
            )
            assert first.status_code == 200, first.text
            asked = silent.received
            assert asked > 0  # it did ask Redis first
            for _ in range(3):
                again = await app.client.post(SINGLE, json=OFFLINE, headers=free.headers)
                assert again.status_code == 200, again.text
            assert silent.received == asked  # and not again, within REDIS_PAUSE
    finally:
        silent.close()


class _SlowToConnectRedis:
    """A TCP relay to the real Redis that holds back the first reply of every connection
    for ``hold`` seconds, longer than a request's Redis deadline: a Redis far away, or a
    machine busy enough that opening a connection is slow."""

    def __init__(self, hold: float = 1.0) -> None:
        self.hold = hold
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = asyncio.get_running_loop().time()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, hold: bool) -> None:
            while chunk := await src.read(65536):
                if hold:
                    await asyncio.sleep(
                        max(0.0, opened + self.hold - asyncio.get_running_loop().time())
                    )
                    hold = False
                dst.write(chunk)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            up_writer.close()
            writer.close()


async def test_the_first_request_after_start_is_limited_by_a_redis_slow_to_connect(
    tb: Testbed, tmp_path: Path, testbed_settings, redis_prefix: str
) -> None:
    """The app opens its Redis connections and loads the limiter's scripts as it starts:
    the first request does not pay for them inside its short deadline (it once timed out
    on a busy machine and was let through past the plan's cap)."""
    async with _SlowToConnectRedis() as url:
        settings = testbed_settings(tb, tmp_path, redis_url=url)
        async with running_app(settings, rate_limit_prefix=redis_prefix) as api:
            free = api.customer(plan="free")
            key = f"{redis_prefix}:concurrency:{free.account_id}"
            with redis.Redis.from_url(REDIS_URL) as client:
                client.zadd(key, {"a-request-elsewhere": client.time()[0] + SLOT_LEASE_SECONDS})
                try:
                    refused = await api.client.post(SINGLE, json=OFFLINE, headers=free.headers)
                    assert "in flight" in assert_error_body(refused, 429)
                finally:
                    client.delete(key)
