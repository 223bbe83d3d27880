"""``Testbed``: the DNS server and every SMTP host of a world, in one background thread.

The servers get their own thread and event loop so that sync tests, async tests and uvicorn
apps can all use them, and so that a tarpitting host never stalls the caller's loop. Each
instance claims a random free ``127.x.y.0/24`` (DNS on ``.53``, hosts on ``.1``–``.250``), which
lets several testbeds - in one process or in several - run side by side on the same ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import socket
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from verimail.testbed.dns_server import Authority, DnsServer
from verimail.testbed.smtp_server import HostRuntime, make_tls_context
from verimail.testbed.stats import HostStats, StatsRegistry
from verimail.testbed.world import World, normalise_name

T = TypeVar("T")

DNS_OCTET = 53
HOST_OCTETS = [o for o in range(1, 251) if o != DNS_OCTET]
BLOCK_RANGE = (100, 250)
_BLOCK_ATTEMPTS = 200
_IN_USE = {errno.EADDRINUSE, errno.EADDRNOTAVAIL}
PATIENCE = 300.0
"""Seconds ``wait_until``/``wait_idle`` wait by default, and the test suite's polls (a job to
finish, a server to come up, a process to exit): they return as soon as what they wait for
happens, so a generous limit costs a passing test nothing and only decides how long a broken
run takes to fail — and a busy machine (issue 48) does not fail a test that waited 10 s."""


def default_ports() -> tuple[int, int]:
    """(SMTP, DNS): the real ports when we may bind them (root), else unprivileged ones."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return 25, 53
    return 2525, 5353


def _tcp_listener(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    # listener says it is TCP. Without it the lines after the first of a multi-line reply
    # (EHLO) wait for the client's delayed ACK: 64 ms instead of 21 ms per EHLO.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # Lets a new testbed reuse an address whose old connections sit in TIME_WAIT; Linux
        # still refuses a second listener on the same address and port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _udp_socket(host: str, port: int) -> socket.socket:
    # No SO_REUSEADDR here: on UDP it would let two testbeds share one address silently.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _ensure_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit towards the hard one: every host holds a socket."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class TestbedError(RuntimeError):
    """The testbed could not start or was used while stopped."""


class Testbed:
    """A running simulated mail world; use ``with Testbed(world) as tb:`` (or start/stop)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self, world: World, smtp_port: int | None = None, dns_port: int | None = None
    ) -> None:
        default_smtp, default_dns = default_ports()
        self._world = world
        self._smtp_port = default_smtp if smtp_port is None else smtp_port
        self._dns_port = default_dns if dns_port is None else dns_port
        self._stats = StatsRegistry()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._base = 0  # linear block number x * 256 + y of the first block
        self._addresses: dict[str, str] = {}  # host name -> assigned 127.x.y.z
        self._runtimes: dict[str, HostRuntime] = {}
        self._reserved: list[socket.socket] = []  # placeholders on .53 of spill blocks
        self._dns: DnsServer | None = None
        self._tls: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Testbed:
        """Bind everything and start serving; returns self once every socket listens."""
        if self._thread is not None:
            raise TestbedError("testbed already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            # Stopped: cancel what is left (e.g. delayed replies) and close the loop.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="verimail-testbed", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self._start_async())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close every socket and join the thread; safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._stop_async(), timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
        self._loop = None
        self._thread = None

    def __enter__(self) -> Testbed:
        """Start it (a testbed started already, to report a failure apart, is used as is);
        leaving the block stops it."""
        return self if self._thread is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60) -> T:
        """Run ``coro`` on the testbed's loop and wait for its result from this thread."""
        if self._loop is None:
            coro.close()
            raise TestbedError("testbed is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ------------------------------------------------------------------ addressing
    @staticmethod
    def _block_ip(linear: int, octet: int) -> str:
        return f"127.{linear // 256}.{linear % 256}.{octet}"

    def _host_ip(self, index: int) -> str:
        block, slot = divmod(index, len(HOST_OCTETS))
        return self._block_ip(self._base + block, HOST_OCTETS[slot])

    def _needs_tls(self, world: World) -> bool:
        return any(h.behaviour.starttls for h in world.hosts.values())

    async def _start_async(self) -> None:
        if self._needs_tls(self._world):
            self._tls = make_tls_context(list(self._world.hosts))
        last_error: OSError | None = None
        for _ in range(_BLOCK_ATTEMPTS):
            x = random.randint(*BLOCK_RANGE)
            y = random.randint(*BLOCK_RANGE)
            self._base = x * 256 + y
            try:
                await self._bring_up()
                return
            except OSError as error:
                if error.errno not in _IN_USE:
                    await self._stop_async()
                    raise
                last_error = error
                await self._stop_async()
        raise TestbedError(
            f"no loopback block (127.x.y.0/24) has DNS port {self._dns_port} and SMTP port "
            f"{self._smtp_port} free ({last_error}); a program listening on 0.0.0.0 at one of "
            "them holds it on every loopback address, so choose other ports"
        )

    async def _bring_up(self) -> None:
        ns = self._block_ip(self._base, DNS_OCTET)
        if self._dns_port == 0:
            tcp = _tcp_listener(ns, 0)
            self._dns_port = tcp.getsockname()[1]
        else:
            tcp = _tcp_listener(ns, self._dns_port)
        try:
            udp = _udp_socket(ns, self._dns_port)
        except BaseException:
            tcp.close()
            raise
        self._dns = DnsServer(self._authority(self._world), self._stats.dns_query)
        await self._dns.start(udp, tcp)
        await self._apply_world(self._world)

    def _authority(self, world: World) -> Authority:
        addresses = dict(self._addresses)
        for host in world.hosts.values():
            if host.address is not None:
                addresses[host.name] = host.address
        return Authority(world, addresses)

    async def _apply_world(self, world: World) -> None:
        """Give new hosts addresses, start/stop servers to match, then switch DNS over."""
        _ensure_fd_limit(2 * len(world.hosts) + 1024)  # listeners plus room for sessions
        if self._tls is None and self._needs_tls(world):
            self._tls = make_tls_context(list(world.hosts))
        for host in world.hosts.values():
            if host.address is None and host.name not in self._addresses:
                index = len(self._addresses)
                if index and index % len(HOST_OCTETS) == 0:
                    # A new block: hold its .53 like a DNS server would, so that no other
                    # testbed claims the block for itself.
                    linear = self._base + index // len(HOST_OCTETS)
                    self._reserved.append(
                        _udp_socket(self._block_ip(linear, DNS_OCTET), self._dns_port)
                    )
                self._addresses[host.name] = self._host_ip(index)
        for name, runtime in list(self._runtimes.items()):
            spec = world.hosts.get(name)
            if spec is None or not spec.runs_server:
                await runtime.stop()
                del self._runtimes[name]
        for host in world.hosts.values():
            runtime = self._runtimes.get(host.name)
            if runtime is not None:
                runtime.spec = host
                runtime.tls_context = self._tls
            elif host.runs_server:
                address = self._addresses[host.name]
                runtime = HostRuntime(host, address, self._stats, self._tls)
                if self._smtp_port == 0:
                    sock = _tcp_listener(address, 0)
                    self._smtp_port = sock.getsockname()[1]
                else:
                    sock = _tcp_listener(address, self._smtp_port)
                await runtime.start(sock)
                self._runtimes[host.name] = runtime
        assert self._dns is not None
        with self._lock:
            self._world = world
        self._dns.authority = self._authority(world)

    async def _stop_async(self) -> None:
        for runtime in list(self._runtimes.values()):
            await runtime.stop()
        self._runtimes.clear()
        if self._dns is not None:
            await self._dns.stop()
            self._dns = None
        for sock in self._reserved:
            sock.close()
        self._reserved.clear()
        self._addresses.clear()

    # ------------------------------------------------------------------ public interface
    @property
    def world(self) -> World:
        """The world currently served."""
        with self._lock:
            return self._world

    @property
    def nameserver(self) -> tuple[str, int]:
        """(address, port) of the DNS server."""
        return self._block_ip(self._base, DNS_OCTET), self._dns_port

    @property
    def smtp_port(self) -> int:
        """The port every SMTP host listens on."""
        return self._smtp_port

    @property
    def dns_port(self) -> int:
        return self._dns_port

    def address_of(self, host_name: str) -> str:
        """The address DNS gives for ``host_name`` (assigned loopback or the fixed address)."""
        name = normalise_name(host_name)
        host = self.world.hosts.get(name)
        if host is not None and host.address is not None:
            return host.address
        try:
            return self._addresses[name]
        except KeyError:
            raise KeyError(f"no host {host_name!r} in the world") from None

    def addresses(self) -> dict[str, str]:
        """Every host of the current world and its address."""
        return {name: self.address_of(name) for name in self.world.hosts}

    def settings_overrides(self) -> dict[str, Any]:
        """Keyword arguments for ``verimail.config.Settings`` that point the engine here."""
        ip, port = self.nameserver
        return {
            "dns_nameservers": [f"{ip}:{port}"],
            "smtp_port": self._smtp_port,
            "smtp_allow_networks": ["127.0.0.0/8"],
        }

    def environment(self) -> dict[str, str]:
        """The same settings as ``VERIMAIL_*`` variables, for a shell or a child process."""
        overrides = self.settings_overrides()
        return {
            "VERIMAIL_DNS_NAMESERVERS": ",".join(overrides["dns_nameservers"]),
            "VERIMAIL_SMTP_PORT": str(overrides["smtp_port"]),
            "VERIMAIL_SMTP_ALLOW_NETWORKS": ",".join(overrides["smtp_allow_networks"]),
        }

    @property
    def dns_queries(self) -> Counter[tuple[str, str]]:
        """Snapshot of queries received, keyed by (lower-case name, type text like "MX")."""
        return self._stats.dns_queries()

    def host_stats(self, host_name: str) -> HostStats:
        """Snapshot of one host's counters (all zero for a host that saw nothing)."""
        return self._stats.host(normalise_name(host_name))

    def total_stats(self) -> HostStats:
        """Counters summed over all hosts; ``peak_concurrent`` is the overall peak."""
        return self._stats.total()

    def wait_idle(self, timeout: float | None = PATIENCE) -> bool:
        """Block until every SMTP session has closed (server side); False on timeout.

        A client's QUIT returns before the server has counted the close; tests that assert on
        ``active`` or compare totals after parallel sessions wait here instead of sleeping.
        """
        return self._stats.wait_idle(timeout)

    def wait_until(
        self, predicate: Callable[[Testbed], bool], timeout: float | None = PATIENCE
    ) -> bool:
        """Block until ``predicate(tb)`` holds (re-checked at every counter change).

        E.g. ``tb.wait_until(lambda tb: tb.host_stats("mx.a.test").active == 2)``.
        """
        return self._stats.wait_until(lambda: predicate(self), timeout)

    def reset_stats(self) -> None:
        """Zero the DNS and SMTP counters (greylist memory is kept: it is world state)."""
        self._stats.reset()

    def reset_greylist(self) -> None:
        """Forget every greylisted pair and postgrey triplet, as if the MTAs restarted."""

        async def clear() -> None:
            for runtime in self._runtimes.values():
                runtime.greylist.clear()
                runtime.triplets_seen.clear()
                runtime.triplets_passed.clear()

        self._call(clear())

    def replace_world(self, world: World) -> None:
        """Serve ``world`` from now on; hosts that exist in both keep their address by name."""
        self._call(self._apply_world(world))
