"""Leases in Redis: a capped set of holders that survives no crash, and the one client
that holds them (:class:`Leases`).

A key is a sorted set whose members are the holders, each scored by its lease's expiry.
Taking a lease sweeps the expired members and adds one only under the cap, in one Lua
script, so check-and-add is atomic across processes; a holder renews its lease while it
runs, and a process that dies stops renewing, so its leases lapse instead of leaking.
Used for the API's per-account concurrency (:mod:`verimail.api.ratelimit`) and for SMTP
politeness per mail host (:mod:`verimail.engine.smtp.host_slots`): both hold a
:class:`Leases`, so the scripts, the renewal and the give-back are written once (the engine
is the one part both may import; the API takes the client from the engine's public names).
:class:`FailOpen` is how the Redis users (those two, and the lessons of
:mod:`verimail.engine.smtp.learned`) ride out an outage.

The Redis client is the synchronous one, called from worker threads: it is safe to share
between threads and event loops, which an asyncio client is not (the host slots are taken
from every event loop of a process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

LEASE_SECONDS = 60
"""A lease lives this long without renewal (the holders of a process that died)."""
RENEW_SECONDS = 20
"""How often a running holder renews its lease."""

ACQUIRE_SCRIPT = """
local now = redis.call('TIME')
local now_s = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_s)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now_s + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""
"""Take a lease when fewer than ARGV[1] live ones exist (expired ones swept first)."""

RENEW_SCRIPT = """
local now = redis.call('TIME')
local now_s = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZADD', KEYS[1], 'XX', now_s + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 1)
return 1
"""
"""Push a held lease's expiry out (``XX``: a lease that already expired is not revived)."""

RETRY_SECONDS = 30
"""After Redis fails, its users go on without it (each process on its own) for this long,
then try it again, rather than each call waiting out a timeout."""


class FailOpen:
    """A Redis user's outage: for :data:`RETRY_SECONDS` after a failure it is ``down`` and
    its caller goes on without Redis; the warning is logged once per outage, not per call."""

    def __init__(self, log: logging.Logger, warning: str, seconds: float = RETRY_SECONDS) -> None:
        self._log = log
        self._warning = warning  # (%d: the seconds; %s: the error)
        self._seconds = seconds
        self._until = 0.0  # monotonic: Redis is not asked until then

    @property
    def down(self) -> bool:
        return time.monotonic() < self._until

    def failed(self, exc: Exception) -> None:
        if not self.down:
            self._log.warning(self._warning, self._seconds, exc)
        self._until = time.monotonic() + self._seconds


POLL_FIRST, POLL_MAX = 0.02, 0.5
"""Waiting for a lease: the first pause between tries, doubling up to the last."""

# Leases are given back from here: a small pool, so a closing holder never waits on Redis.
_GIVE_BACK = ThreadPoolExecutor(max_workers=2, thread_name_prefix="verimail-slots")


class Leases:
    """Leases in Redis under ``prefix`` (one key per name), taken, renewed and given back
    (see the module docstring). A thread renews the leases this client holds (not the
    holders' event loops, which CPU work can hold for longer than a lease lives). A Redis
    failure makes it ``down`` for ``retry_seconds``, ``warning`` logged once (%d: the
    seconds; %s: the error); the holder decides what that means (both fail open)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        log: logging.Logger,
        warning: str,
        retry_seconds: float = RETRY_SECONDS,
        lease_seconds: float = LEASE_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
    ) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._acquire = self._client.register_script(ACQUIRE_SCRIPT)
        self._renew = self._client.register_script(RENEW_SCRIPT)
        self._prefix = prefix
        self._lease_seconds = lease_seconds
        self._renew_seconds = renew_seconds
        self._outage = FailOpen(log, warning, retry_seconds)
        self._held: dict[str, str] = {}  # lease id -> key, renewed by the thread below
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def key(self, name: str) -> str:
        return f"{self._prefix}:{name.lower()}"

    @property
    def down(self) -> bool:
        """Redis failed less than ``retry_seconds`` ago: holders do not wait on it."""
        return self._outage.down

    def warm_up(self) -> None:
        """Open a connection and load the scripts now (blocking: call it from a thread), so
        the first take does not pay for them; a failure is raised."""
        self._client.ping()
        for script in (ACQUIRE_SCRIPT, RENEW_SCRIPT):
            self._client.script_load(script)

    async def take(self, name: str, cap: int, urgent: bool = False) -> str | None:
        """Wait for one of ``name``'s ``cap`` leases (a host's slots); its id, or None when
        Redis is down (the caller goes on with its own slots). Urgent takers keep asking at the
        shortest pause rather than backing off, so they tend to be first."""
        member = uuid.uuid4().hex
        pause = POLL_FIRST
        while not self.down:
            try:
                taken = await self._try(name, cap, member)
            except Exception as exc:
                self._failed(exc)
                return None
            if taken:
                return member
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = pause if urgent else min(pause * 2, POLL_MAX)
        return None

    async def take_now(self, name: str, cap: int) -> str | None:
        """One try at one of ``name``'s ``cap`` leases: its id, or None when all are held.
        A Redis failure is raised: the holder words and pauses it (the API's limiter)."""
        member = uuid.uuid4().hex
        return member if await self._try(name, cap, member) else None

    async def _try(self, name: str, cap: int, member: str) -> bool:
        key = self.key(name)
        asking = asyncio.ensure_future(
            asyncio.to_thread(self._acquire, keys=[key], args=[cap, self._lease_seconds, member])
        )
        try:
            taken = await asyncio.shield(asking)
        except asyncio.CancelledError:
            # The script runs on in its thread and may still add the lease: give it
            # back once it has, or the slot stays taken for LEASE_SECONDS everywhere.
            asking.add_done_callback(lambda done: self._drop_if_taken(done, name, member))
            raise
        if taken:
            self._hold(key, member)
        return bool(taken)

    def _drop_if_taken(self, asking: asyncio.Future[object], name: str, member: str) -> None:
        if not asking.cancelled() and asking.exception() is None and asking.result():
            self.give_back(name, member)

    def _hold(self, key: str, member: str) -> None:
        with self._held_lock:
            self._held[member] = key
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_held, name="verimail-slot-leases", daemon=True
                )
                self._renewer.start()

    def _renew_held(self) -> None:
        """Renew every held lease each RENEW_SECONDS, from a thread of its own: an event
        loop held by CPU work (parsing a big upload) must not let its sessions' leases lapse
        while the sessions stay open — other processes would open more."""
        while not self._stop.wait(self._renew_seconds):
            with self._held_lock:
                held = list(self._held.items())
            for member, key in held:
                try:
                    self._renew(keys=[key], args=[self._lease_seconds, member])
                except Exception as exc:  # it lapses by itself; the next round may work
                    self._failed(exc)
                    break

    def give_back(self, name: str, member: str) -> Future[None]:
        """Drop the lease, from a worker thread: it runs while a session closes, even under
        cancellation, so it must not await, and must not block the loop if Redis hangs.
        A holder that must see it gone before it answers awaits the future it returns."""
        key = self.key(name)
        with self._held_lock:
            self._held.pop(member, None)

        def drop() -> None:
            try:
                self._client.zrem(key, member)
            except Exception as exc:  # the lease lapses by itself
                self._failed(exc)

        return _GIVE_BACK.submit(drop)

    def _failed(self, exc: Exception) -> None:
        self._outage.failed(exc)

    def close(self) -> None:
        """Stop renewing (the renewer thread ends at its next wake-up, at once) and close
        the client. Leases still held lapse by themselves."""
        self._stop.set()
        with contextlib.suppress(Exception):
            self._client.close()
