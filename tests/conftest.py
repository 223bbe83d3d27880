"""Shared fixtures: the loopback mail world (``testbed``), settings pointing at it, and the
``outside_connections`` socket guard that keeps every packet of a test on 127.0.0.0/8."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import process_leaks
import pytest
from cli_helpers import PATIENCE, WIDTH_ENV

# Output checks must not depend on the terminal that runs the suite: Rich consoles made in
# this process (typer's CliRunner tests) and the CLI subprocesses it starts draw at one
# fixed width. Set before anything of ours is imported, since a console reads it when made.
os.environ.update(WIDTH_ENV)
# No app of the suite checks SMTP egress in the background (to VERIMAIL_DOCTOR_DOMAIN, by
# default gmail.com) unless its test asks for it: traffic stays on the testbed.
os.environ.setdefault("VERIMAIL_DOCTOR_INTERVAL", "0")
# A `verimail` process of the suite that starts Prefect's embedded server gives it as long as
# the suite's polls wait (runners/local.py: 120 s unless this says otherwise): a busy
# machine's slow start is no failure of the test that started it (issue 48).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", f"{PATIENCE:g}")

from api_helpers import TEST_RETRY_WINDOW, TEST_TIMEOUTS, RunningApp, api_world, running_app

from verimail.config import Settings
from verimail.testbed.server import Testbed
from verimail.testbed.world import World

# Everything this pytest process starts carries its mark, so the session's end can find a
# server that survived (tests/process_leaks.py). Set before any fixture starts one.
SUITE_MARK = process_leaks.mark_this_process()


def make_testbed_settings(tb: Testbed, tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for an engine run against ``tb``: timeouts no busy machine reaches on
    loopback (``TEST_TIMEOUTS``), a short greylisting back-off and retry window."""
    values: dict[str, Any] = {
        "data_dir": tmp_path,
        **TEST_TIMEOUTS,
        "smtp_greylist_delay": 0.05,
        **TEST_RETRY_WINDOW,
        "prefect_warm_up": False,  # a test session shares one Prefect server (prefect_harness)
        **tb.settings_overrides(),
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., Testbed]]:
    """``make(world, **kwargs) -> Testbed``: started now, stopped at teardown."""
    started: list[Testbed] = []

    def make(world: World, **kwargs: Any) -> Testbed:
        tb = Testbed(world, **kwargs).start()
        started.append(tb)
        return tb

    yield make
    for tb in reversed(started):
        tb.stop()


@pytest.fixture
def testbed_settings() -> Callable[..., Settings]:
    """The ``make_testbed_settings(tb, tmp_path, **overrides)`` helper, as a fixture."""
    return make_testbed_settings


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """The suite leaves no process behind: at the end of this pytest process's session (a
    worker's, under xdist), a process it started that still runs fails the run, named with
    its command line, and is killed. Set up first, so torn down last (after the Prefect
    harness and every other fixture have stopped theirs)."""
    yield
    if not process_leaks.can_look():
        return
    left = process_leaks.survivors(SUITE_MARK)
    if left:
        process_leaks.kill(left)
        listed = "\n  ".join(str(p) for p in left)
        pytest.fail(
            f"{len(left)} process(es) started by the suite outlived it (now killed):\n  {listed}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for the whole session (it takes ~15 s to start), on
    PostgreSQL where it answers (``runners/testing.py`` says why)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from verimail.runners.testing import prefect_server

    with prefect_server():
        yield


LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
LOCAL_NAMES = {"localhost"}


def _outside(host: object) -> bool:
    """True unless ``host`` is an address in 127.0.0.0/8 (IPv4-mapped forms included).

    ``::1`` counts as outside on purpose: the SSRF tests must see *every* attempt to
    reach a non-127/8 address, and nothing of ours needs IPv6 loopback.
    """
    if not isinstance(host, str):
        return False  # AF_UNIX paths and the like
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host.lower() not in LOCAL_NAMES  # a name: resolving it would leave the box
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (ip.version == 4 and ip in LOOPBACK)


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


@pytest.fixture
def outside_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Refuse (and record) any connect, datagram or name lookup that would leave 127.0.0.0/8.

    Patched at the ``socket`` level, so it holds for asyncio, aiosmtplib, dnspython and
    httpx alike: the attempt raises before a packet is sent, and the test asserts the
    returned list is empty. Name lookups of anything but IP literals and ``localhost``
    are refused too, since a resolver query is itself a packet to the outside.
    """
    attempts: list[tuple[Any, ...]] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_sendto = socket.socket.sendto
    real_sendmsg = socket.socket.sendmsg
    real_getaddrinfo = socket.getaddrinfo

    def check(address: Any) -> None:
        if isinstance(address, tuple) and _outside(address[0]):
            attempts.append(tuple(address))
            raise ConnectionRefusedError(f"test guard: refused connection to {address}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    def sendto(self: socket.socket, data: Any, *args: Any) -> int:
        check(args[-1])
        return real_sendto(self, data, *args)

    def sendmsg(self: socket.socket, buffers: Any, *args: Any) -> int:
        if len(args) >= 3:
            check(args[2])
        return real_sendmsg(self, buffers, *args)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and _outside(name) and not _is_literal(name):
            # A literal resolves locally; a name would be a query to some resolver.
            attempts.append((name, args[0] if args else None))
            raise socket.gaierror(socket.EAI_NONAME, f"test guard: no lookup of {name}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket.socket, "sendto", sendto)
    monkeypatch.setattr(socket.socket, "sendmsg", sendmsg)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return attempts


@pytest.fixture(autouse=True)
def _fresh_dns_cache() -> Iterator[None]:
    """Every test builds its own world: answers cached from another test's must not leak in."""
    from verimail.engine import dns_facts

    dns_facts.clear_cache()
    yield
    dns_facts.clear_cache()


@pytest.fixture
def tb(testbed_factory: Callable[..., Testbed]) -> Testbed:
    """The API tests' small world (``api_helpers.api_world``); a test file whose tests need
    another world defines its own ``tb``, which takes this one's place there."""
    return testbed_factory(api_world())


@pytest.fixture
async def api(tb: Testbed, tmp_path: Path) -> AsyncIterator[RunningApp]:
    """The app on ``tb`` (this file's or the test file's own), its lifespan running."""
    async with running_app(make_testbed_settings(tb, tmp_path)) as running:
        yield running
