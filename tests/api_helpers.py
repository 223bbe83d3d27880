"""Shared helpers for the API tests: running apps (in-process and as uvicorn processes),
accounts with keys, and the small worlds the tests verify against.

Everything is real: the app runs its lifespan (migrations, engine, limiter), requests go
through httpx (ASGI in-process, or TCP to uvicorn subprocesses), the store is SQLite or
PostgreSQL, and addresses are verified against the loopback testbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cli_helpers import VERIMAIL_BIN
from fastapi import FastAPI

from verimail.api.app import create_app
from verimail.config import Settings
from verimail.runners.testing import free_port
from verimail.store.accounts import create_account, create_api_key
from verimail.store.billing.ledger import ledger
from verimail.store.billing.pools import balance
from verimail.store.db import Store, make_engine
from verimail.testbed.server import PATIENCE, Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

SLOW_REPLY_DELAY = 0.3
"""Seconds each SMTP reply of ``mx.slow.test`` takes: long enough to overlap requests."""

TEST_TIMEOUTS = {
    "dns_timeout": 10.0,
    "smtp_connect_timeout": 10.0,
    "smtp_command_timeout": 10.0,
    "verify_timeout": 60.0,
}
"""The suite's DNS and SMTP timeouts and a synchronous call's deadline: far above what the
testbed on loopback takes to answer even beside busy loops on every core (issue 48: with
2 s, at a load of 8 the testbed's DNS answered after the resolver gave up, and a test got a
DNS failure it was not about). No test waits them out: a test about a timeout sets its own,
against a server that never answers within it (``hostile="silent"``, a tarpit far longer
than the timeout)."""

TIMEOUTS_ENV = {f"VERIMAIL_{name.upper()}": str(value) for name, value in TEST_TIMEOUTS.items()}
"""``TEST_TIMEOUTS`` as the environment of a ``verimail`` process (one on the demo's own
testbed, say)."""

STALE_AFTER = 8.0
"""``job_stale_after`` of the suite's tests whose reaper must resume a job whose process was
killed (or that want the reaper to sweep often: every quarter of it). Recovery itself needs
a short one — the test waits it out after the kill — but a live run must never look dead:
its first beat after the flow run starts, and each beat after (every quarter of this), may
come seconds late on a busy machine. At 2 s, at a load of 12 the reaper took a live run for
dead and, its runs used up, failed the job (issue 48)."""


def api_world() -> World:
    """A small world: a normal domain, a catch-all one and a slow one."""
    return World.of(
        hosts=[
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "bob", "info"})),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
            HostSpec(
                "mx.slow.test", HostBehaviour(mailboxes={"sam"}, reply_delay=SLOW_REPLY_DELAY)
            ),
        ],
        domains=[
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
            DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
        ],
    )


def host_per_domain(hosts: Mapping[str, HostBehaviour]) -> World:
    """A world where each domain ``d`` of ``hosts`` has its own server ``mx.d``."""
    return World.of(
        hosts=[HostSpec(f"mx.{d}", b) for d, b in hosts.items()],
        domains=[DomainSpec(d, mx=[(10, f"mx.{d}")]) for d in hosts],
    )


@dataclass
class Customer:
    """An account and a raw API key for it."""

    account_id: int
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def make_customer(store: Store, plan: str = "enterprise", credits: int = 100) -> Customer:
    """A new account on ``plan`` holding exactly ``credits`` prepaid credits, with a key.

    Credits come from a signup grant of that size, so the ledger reads naturally. Plans with
    an allowance (free, starter …) also have that allowance on top; tests that count
    credits exactly use enterprise, which has none.
    """
    settings = store.settings.model_copy(update={"signup_credits": credits})
    account = create_account(store.engine, settings, plan=plan)
    key, _info = create_api_key(store.engine, account.id, name="test")
    return Customer(account.id, key)


def total_balance(store: Store, account_id: int) -> int:
    """What the account can spend now (prepaid plus allowance left)."""
    return balance(store.engine, account_id).total


def ledger_size(store: Store, account_id: int) -> int:
    return len(ledger(store.engine, account_id, limit=10_000))


@dataclass
class RunningApp:
    """An app with its lifespan running, an httpx client on it, and its own store handle."""

    app: FastAPI
    client: httpx.AsyncClient
    store: Store

    def customer(self, plan: str = "enterprise", credits: int = 100) -> Customer:
        return make_customer(self.store, plan, credits)


@contextlib.asynccontextmanager
async def running_app(
    settings: Settings,
    *,
    rate_limit_prefix: str = "verimail",
    raise_app_exceptions: bool = True,
) -> AsyncIterator[RunningApp]:
    """``create_app(settings)`` with its lifespan, and an ASGI httpx client talking to it."""
    app = create_app(settings, rate_limit_prefix=rate_limit_prefix)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://verimail.test", timeout=PATIENCE
        ) as client:
            # The app migrated the database (or found it down); the test's own handle on it.
            store = Store(engine=make_engine(settings), settings=settings)
            try:
                yield RunningApp(app, client, store)
            finally:
                store.close()


def assert_error_body(response: httpx.Response, status: int) -> str:
    """The response is ``status`` with a JSON ``{"detail": str}`` body; returns the detail."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict)
    assert isinstance(body.get("detail"), str) and body["detail"], body
    extra = set(body) - {"detail", "errors"}
    assert not extra, f"unexpected keys {extra} in error body {body}"
    return body["detail"]


async def wait_until(predicate: Any, timeout: float = PATIENCE, what: str = "condition") -> None:
    """Poll ``predicate()`` (cheap, non-blocking) until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# --- processes ---------------------------------------------------------------------------


TEST_RETRY_WINDOW = {"job_retry_delay": 0.5}
"""A job's deferred retries in the suite's worlds: after 0.5 s, then 1 s — not the
production 15 min, which would hold every job with an unreachable address that long.
Tests of the retries themselves set their own."""


def env_for_testbed(tb: Testbed) -> dict[str, str]:
    """The environment that points a ``verimail`` process at the testbed."""
    return {
        **tb.environment(),
        **{f"VERIMAIL_{name.upper()}": str(value) for name, value in TEST_RETRY_WINDOW.items()},
        **TIMEOUTS_ENV,
    }


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The current environment without any ``VERIMAIL_*`` setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIMAIL_")}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class ServerProcess:
    """A ``verimail serve`` subprocess and its base URL."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serve_processes(
    count: int,
    env: Mapping[str, str],
    workdir: Path,
    ready_timeout: float = PATIENCE,
    args: Sequence[str] = (),
) -> Iterator[list[ServerProcess]]:
    """Start ``count`` ``verimail serve`` processes and wait until each says it is healthy.

    Readiness is polled on ``/api/health``; a process that exits early fails the test with
    its log. All are terminated (then killed if need be) at the end, and what each started
    (its process group) with it.
    """
    servers: list[ServerProcess] = []
    try:
        for i in range(count):
            port = free_port()
            log_path = workdir / f"serve-{i}.log"
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [str(VERIMAIL_BIN), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
                    env=clean_env(env),
                    cwd=workdir,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # (its group: what it started, stopped with it)
                )
            servers.append(ServerProcess(process, f"http://127.0.0.1:{port}", log_path))
        for server in servers:
            _wait_healthy(server, ready_timeout)
        yield servers
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.process.terminate()
        for server in servers:
            try:
                server.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
            # A server killed (or ended on a signal) while it started Prefect's embedded
            # server left that server running, re-parented to init (issue 36): the rest of
            # its process group goes with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)


def _wait_healthy(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2) as client:
        while True:
            if server.process.poll() is not None:
                raise AssertionError(
                    f"verimail serve exited with {server.process.returncode}:\n{server.log()}"
                )
            try:
                if client.get(f"{server.base_url}/api/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{server.base_url} not healthy in time:\n{server.log()}")
            time.sleep(0.05)


async def poll_job(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout: float = PATIENCE
) -> dict[str, Any]:
    """GET a job until it is completed or failed; its last body. Fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        response = await client.get(url, headers=dict(headers))
        assert response.status_code == 200, response.text
        body = response.json()
        if body["status"] in ("completed", "failed"):
            return body
        assert time.monotonic() < deadline, f"job still {body['status']} after {timeout} s: {body}"
        await asyncio.sleep(0.05)


async def json_bulk_job(
    client: httpx.AsyncClient, customer: Customer, emails: Sequence[str], timeout: float = 60.0
) -> dict[str, Any]:
    """``POST /api/verify/bulk`` of ``emails`` as ``customer``, then its final state."""
    created = await client.post(
        "/api/verify/bulk", headers=customer.headers, json={"emails": list(emails)}
    )
    assert created.status_code == 200, created.text
    url = f"/api/verify/bulk/{created.json()['job_id']}"
    return await poll_job(client, url, customer.headers, timeout)


async def poll_until(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    want: Callable[[dict[str, Any]], bool],
    timeout: float = PATIENCE,
) -> dict[str, Any]:
    """GET a job until ``want(body)``; its body. Fails if the job finishes first, or after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        body = (await client.get(url, headers=dict(headers))).json()
        if want(body):
            return body
        assert body["status"] not in ("completed", "failed"), body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.05)


class RecordingRunner:
    """A job runner that records submissions without running them: the jobs are created
    for real and stay ``pending`` (tests about who may see a job, or what a request
    answers, need no Prefect run)."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, int]] = []

    def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
        self.submitted.append((kind, job_id))

    def shutdown(self) -> None:
        return None


class RawTcpServer:
    """A TCP server on loopback for peers that misbehave below HTTP or RESP (a receiver that
    drips its answer, a Redis that never replies): each connection gets a thread running
    :meth:`handle`. ``address`` is ``host:port``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # (OSError: the client hung up)
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()
