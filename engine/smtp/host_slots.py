"""SMTP session slots per mail host, held by the service as a whole, not by one job.

Politeness is a promise to the mail host: at most ``smtp_max_sessions_per_host`` sessions
at once from us. A "host" here is the server's IP address, not an MX name: two names (of
two domains, or an MX and its alias) that lead to one server share its slots.

Every event loop of a process draws from one set of slots (the local runner runs each
job on its own loop, and the API verifies on another), and with Redis
(``VERIMAIL_REDIS_URL``) every process and machine draws from one set too, so ten workers
open five sessions to a host between them, not fifty.

In Redis a host's slots are leases, held by the one lease client
(:class:`verimail.engine.leases.Leases`, as the API's concurrency slots are). A thread renews
the leases of a process's open sessions (not the sessions' event loop, which CPU work can
hold for longer than a lease lives); a process that dies stops renewing, and its leases
lapse after :data:`~verimail.engine.leases.LEASE_SECONDS`. Redis failures fail *open* to the
process's own slots for :data:`~verimail.engine.leases.RETRY_SECONDS` (a warning is
logged): an outage of the counter store must not stop verification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Iterator, MutableMapping
from contextvars import ContextVar
from typing import Any

from verimail.engine.leases import LEASE_SECONDS, RENEW_SECONDS, Leases

log = logging.getLogger("verimail.engine.smtp.host_slots")

_Waiters = deque[tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]]

_URGENT: ContextVar[bool] = ContextVar("verimail_urgent_slots", default=False)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Sessions opened inside go before queued ones that are not urgent: for the API's
    requests, whose client is waiting, over jobs, which can wait a session longer."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


class SharedSemaphore:
    """A counting semaphore any event loop of the process can wait on (``asyncio.Semaphore``
    belongs to one loop). First come, first served, except that urgent waiters go before
    the others; a waiter cancelled while its slot was being handed to it gives it back."""

    def __init__(self, value: int) -> None:
        self._cap = value
        self._value = value  # free slots; below zero after lower(), until enough are given back
        self._sessions = 0  # holders whose session is open (greeted), see HeldSlots.opened
        self._lock = threading.Lock()
        # (urgent waiters, the rest): each (loop, future), served in that order
        self._queues: tuple[_Waiters, _Waiters] = (deque(), deque())

    async def acquire(self, urgent: bool = False) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._value > 0:  # (a free slot means nobody waits: release hands over)
                self._value -= 1
                return
            waiter: asyncio.Future[None] = loop.create_future()
            queue = self._queues[0 if urgent else 1]
            queue.append((loop, waiter))
        try:
            await waiter
        except BaseException:
            with self._lock:
                if (loop, waiter) in queue:
                    queue.remove((loop, waiter))
                    raise
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over, then cancelled before it could run
            raise  # (else the hand-over is still on its way: _grant gives it back)

    def release(self) -> None:
        with self._lock:
            if self._value < 0:  # (held over a lowered cap: this slot goes, unused)
                self._value += 1
                return
            for queue in self._queues:
                while queue:
                    loop, waiter = queue.popleft()
                    try:
                        loop.call_soon_threadsafe(self._grant, waiter)
                        return
                    except RuntimeError:  # that loop is closed: its waiter is gone
                        continue
            self._value += 1

    def _grant(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():  # cancelled meanwhile: pass the slot on
            self.release()
        else:
            waiter.set_result(None)

    def lower(self, cap: int) -> None:
        """Hold at most ``cap`` slots from now on (never fewer than one): slots held beyond
        it are not handed on when given back."""
        with self._lock:
            cap = max(1, cap)
            if cap < self._cap:
                self._value -= self._cap - cap
                self._cap = cap

    @property
    def held(self) -> int:
        """Slots taken and not given back."""
        with self._lock:
            return self._cap - self._value

    def count_session(self, change: int) -> None:
        with self._lock:
            self._sessions += change

    @property
    def sessions(self) -> int:
        """Holders whose session is open: past its greeting, not just dialling."""
        with self._lock:
            return self._sessions

    @property
    def free(self) -> int:
        """Slots no one holds (for tests and diagnostics)."""
        with self._lock:
            return self._value

    @property
    def waiting(self) -> int:
        """Takers queued for a slot (for tests and diagnostics)."""
        with self._lock:
            return sum(len(queue) for queue in self._queues)


class HeldSlots:
    """What one SMTP session holds: its host's slot, its Redis lease and a process slot."""

    def __init__(self, owner: HostSlots, host: str) -> None:
        self._owner = owner
        self.host = host
        self._held: list[SharedSemaphore] = []
        self._lease: str | None = None
        self._open: SharedSemaphore | None = None  # the host's, once the session is open

    def opened(self) -> None:
        """The session is open (the server greeted it): it counts among the sessions
        :meth:`HostSlots.learn_cap` reads, which dials under way do not."""
        if self._open is None and self._held:
            self._open = self._held[0]
            self._open.count_session(1)

    def release(self) -> None:
        """Give everything back (idempotent; no await, so it completes under cancellation)."""
        if self._open is not None:
            self._open.count_session(-1)
            self._open = None
        if self._lease is not None and self._owner.leases is not None:
            self._owner.leases.give_back(self.host, self._lease)
        self._lease = None
        while self._held:
            self._held.pop().release()


class HostSlots:
    """Per-host and process-wide session slots (see the module docstring)."""

    def __init__(
        self, per_host: int, total: int, redis_url: str | None, prefix: str = "verimail"
    ) -> None:
        self.per_host = per_host
        self.total = total
        self.leases = (
            Leases(
                redis_url,
                f"{prefix}:smtp-host",
                log=log,
                warning="SMTP host slots in Redis failed; each process uses its own for %d s: %s",
                lease_seconds=LEASE_SECONDS,  # (read here: the suite shortens them)
                renew_seconds=RENEW_SECONDS,
            )
            if redis_url
            else None
        )

    async def take(self, host: str, cap: int | None = None) -> HeldSlots:
        """Wait for a slot on ``host``: this process's first (so a session queued behind a
        busy host waits here, holding nothing shared), then the Redis lease, then the
        process-wide slot. ``host`` is the slot's key: the server's address, with the
        egress's name for a session through a proxy (``Egress.slot_key``), since each
        egress is a source address of its own; ``cap``, an egress's own cap (default
        ``per_host``)."""
        held = HeldSlots(self, host)
        hurry = _URGENT.get()
        cap = cap or self.per_host
        try:
            sem = _host_semaphore(host, cap)
            await sem.acquire(urgent=hurry)
            held._held.append(sem)
            if self.leases is not None:
                held._lease = await self.leases.take(host, cap, urgent=hurry)
            total = _total_semaphore(self.total)
            await total.acquire(urgent=hurry)
            held._held.append(total)
        except BaseException:
            held.release()
            raise
        return held

    def busy(self, host: str, cap: int | None = None) -> bool:
        """Whether sessions of this process hold (or are opening with) slots on ``host``."""
        sem = host_semaphore(host, cap or self.per_host)
        return sem is not None and sem.held > 0

    def learn_cap(self, host: str, cap: int | None = None) -> bool:
        """The server at ``host`` turned a session away for now (421 "too many
        connections") while this process holds others there: it takes no more than those
        from us, so later sessions queue for their slots (first come, first served) rather
        than dial and be turned away. A dial waits for the others' progress, not for a
        fixed time, and no caller is starved by others who happen to dial first.

        False when this process has no session open there (nothing to learn: other
        machines' sessions, or the server still counts one just closed; dials under way
        do not count, or a refused dial would queue behind the next refused dial at
        once). The lower cap lasts while this process has sessions at or queued for
        ``host``, then is forgotten with its slots."""
        sem = host_semaphore(host, cap or self.per_host)
        if sem is None:
            return False
        sessions = sem.sessions
        if sessions <= 0:
            return False
        sem.lower(sessions)
        return True

    def close(self) -> None:
        if self.leases is not None:
            self.leases.close()


# One semaphore per (host, cap) for the whole process, kept while a session holds or awaits
# it (weak values): a long-running process that meets millions of hosts keeps only the ones
# in use, and a fresh one is equivalent to a forgotten one.
_HOSTS: weakref.WeakValueDictionary[tuple[str, int], SharedSemaphore] = (
    weakref.WeakValueDictionary()
)
_TOTALS: dict[int, SharedSemaphore] = {}
_REGISTRY_LOCK = threading.Lock()


def _semaphore(
    registry: MutableMapping[Any, SharedSemaphore], key: Any, cap: int
) -> SharedSemaphore:
    with _REGISTRY_LOCK:
        sem = registry.get(key)
        if sem is None:
            sem = registry[key] = SharedSemaphore(cap)
        return sem


def _host_semaphore(host: str, cap: int) -> SharedSemaphore:
    return _semaphore(_HOSTS, (host.lower(), cap), cap)


def _total_semaphore(cap: int) -> SharedSemaphore:
    return _semaphore(_TOTALS, cap, cap)


def host_semaphore(host: str, cap: int) -> SharedSemaphore | None:
    """The process's slots for ``host``, None when no session holds or awaits one (for
    tests and diagnostics)."""
    with _REGISTRY_LOCK:
        return _HOSTS.get((host.lower(), cap))
