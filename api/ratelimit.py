"""Per-account request rate (the ``limits`` library) and concurrency caps, from the plan.

Both come in two storages behind one interface:

* **memory** (default): counters live in this process; right for one API process.
* **Redis** (``VERIMAIL_REDIS_URL``): every API process shares the counters, so an account
  gets its plan's limits in total, not per process.

Rate: a moving window of 60 s (``limits``' ``MovingWindowRateLimiter``): the 11th request of
a Free account inside any 60 s is refused, and ``Retry-After`` says when the oldest of the
ten leaves the window.

Concurrency in Redis is a sorted set per account whose members are the requests in flight,
scored by a lease expiry: leases held by the engine's one lease client
(:class:`~verimail.engine.leases.Leases`, as the SMTP host slots are). A request's lease is
renewed while it runs; a process that crashes stops renewing, and its slots expire after
:data:`~verimail.engine.leases.LEASE_SECONDS` instead of leaking forever. Expired members are
swept by the same Lua script that admits requests, so the check-and-add is atomic across
processes.

Redis failures fail *open* (the request is allowed, a warning is logged): limits protect
fairness, and an outage of the counter store should not take the whole API down with it.
Nor slow it down: each Redis call has :data:`REDIS_DEADLINE` seconds, and after a failure
the limiter does not ask Redis again for :data:`REDIS_PAUSE` seconds (a Redis that accepts
connections and never answers cost every request two timeouts before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from verimail.engine import LEASE_SECONDS as SLOT_LEASE_SECONDS
from verimail.engine import Leases

log = logging.getLogger("verimail.api.ratelimit")

REDIS_DEADLINE = 0.5
"""Seconds a rate or concurrency call to Redis may take before the request is let through."""
REDIS_PAUSE = 5.0
"""Seconds after a Redis failure during which requests are let through without asking it."""
WARM_UP_DEADLINE = 3.0
"""Seconds the app's start-up gives Redis to open a connection and load the scripts."""


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused, and how long to wait (whole seconds, >= 1)."""

    detail: str
    retry_after: int


class Limiter:
    """Rate and concurrency limits for accounts; one per app."""

    def __init__(self, redis_url: str | None = None, prefix: str = "verimail") -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self._storage: Storage
        self._leases: Leases | None = None
        if redis_url:
            scheme_url = redis_url if redis_url.startswith("async+") else f"async+{redis_url}"
            self._storage = RedisStorage(
                scheme_url, implementation="redispy", key_prefix=f"{prefix}:rate"
            )
            self._leases = Leases(
                redis_url,
                f"{prefix}:concurrency",
                log=log,
                warning="concurrency storage failed, requests allowed for %d s: %s",
                retry_seconds=REDIS_PAUSE,
                lease_seconds=SLOT_LEASE_SECONDS,
            )
        else:
            self._storage = MemoryStorage()
        self._window = MovingWindowRateLimiter(self._storage)
        self._in_flight: dict[int, int] = {}  # memory mode: account id -> requests running
        self._redis_down_until = 0.0  # (monotonic time; see REDIS_PAUSE)

    def _skip_redis(self) -> bool:
        """Whether Redis failed within the last :data:`REDIS_PAUSE` seconds (fail open)."""
        return self._leases is not None and (
            time.monotonic() < self._redis_down_until or self._leases.down
        )

    def _redis_failed(self, what: str, exc: BaseException) -> None:
        self._redis_down_until = time.monotonic() + REDIS_PAUSE
        detail = str(exc) or type(exc).__name__
        log.warning("%s failed, requests allowed for %g s: %s", what, REDIS_PAUSE, detail)

    async def warm_up(self) -> None:
        """Open a Redis connection and load the limiter's scripts before the first request:
        a first request that paid for both inside :data:`REDIS_DEADLINE` on a busy machine
        timed out and was let through unlimited. A Redis that does not answer in time is
        logged and left to the requests (which fail open)."""
        if self._leases is None:
            return
        try:
            async with asyncio.timeout(WARM_UP_DEADLINE):
                await asyncio.to_thread(self._leases.warm_up)
                await self._window.get_window_stats(RateLimitItemPerMinute(1), "warm-up")
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            log.warning("rate limiter: Redis did not answer at start-up: %s", detail)

    @property
    def backend(self) -> str:
        """``redis`` or ``memory``: where the counters live."""
        return "redis" if self._leases is not None else "memory"

    async def close(self) -> None:
        """Release Redis connections (app shutdown)."""
        if self._leases is not None:
            self._leases.close()
            bridge = getattr(self._storage, "bridge", None)
            storage_client = getattr(bridge, "storage", None)
            if storage_client is not None:
                with contextlib.suppress(Exception):
                    await storage_client.aclose()

    # --- rate --------------------------------------------------------------------------------

    async def hit(self, account_id: int, per_minute: int | None) -> Refusal | None:
        """Count one request; a :class:`Refusal` when it is over the plan's rate."""
        if per_minute is None:
            return None
        item = RateLimitItemPerMinute(per_minute)
        key = ("account", str(account_id))
        if self._skip_redis():
            return None
        try:
            async with asyncio.timeout(REDIS_DEADLINE if self._leases is not None else None):
                if await self._window.hit(item, *key):
                    return None
                stats = await self._window.get_window_stats(item, *key)
        except Exception as exc:  # storage down: fail open (see module docstring)
            self._redis_failed("rate limiter storage", exc)
            return None
        wait = max(1, math.ceil(stats.reset_time - time.time()))
        return Refusal(
            f"Rate limit exceeded: your plan allows {per_minute} requests per minute. "
            f"Retry in {wait} s.",
            wait,
        )

    # --- concurrency -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self, account_id: int, cap: int | None) -> AsyncIterator[Refusal | None]:
        """Hold one of the account's concurrent-request slots for the ``with`` body.

        Yields None when admitted, or a :class:`Refusal` (nothing held) when all are taken.
        """
        if cap is None:
            yield None
            return
        if self._skip_redis():
            yield None
        elif self._leases is None:
            async with self._memory_slot(account_id, cap) as refusal:
                yield refusal
        else:
            async with self._redis_slot(account_id, cap) as refusal:
                yield refusal

    @staticmethod
    def _refusal(cap: int) -> Refusal:
        noun = "request" if cap == 1 else "requests"
        return Refusal(
            f"Too many concurrent requests: your plan allows {cap} {noun} in flight at once. "
            "Retry when one has finished.",
            1,
        )

    @contextlib.asynccontextmanager
    async def _memory_slot(self, account_id: int, cap: int) -> AsyncIterator[Refusal | None]:
        # One event loop per app: no await between the check and the increment, so no lock.
        if self._in_flight.get(account_id, 0) >= cap:
            yield self._refusal(cap)
            return
        self._in_flight[account_id] = self._in_flight.get(account_id, 0) + 1
        try:
            yield None
        finally:
            left = self._in_flight[account_id] - 1
            if left:
                self._in_flight[account_id] = left
            else:
                del self._in_flight[account_id]

    @contextlib.asynccontextmanager
    async def _redis_slot(self, account_id: int, cap: int) -> AsyncIterator[Refusal | None]:
        assert self._leases is not None
        name = str(account_id)
        try:
            async with asyncio.timeout(REDIS_DEADLINE):
                lease = await self._leases.take_now(name, cap)
        except Exception as exc:  # fail open
            self._redis_failed("concurrency storage", exc)
            yield None
            return
        if lease is None:
            yield self._refusal(cap)
            return
        try:
            yield None
        finally:
            try:  # (given back before the answer: the next request may take the slot)
                async with asyncio.timeout(REDIS_DEADLINE):
                    await asyncio.wrap_future(self._leases.give_back(name, lease))
            except Exception as exc:  # the lease expires by itself
                log.warning("could not release a concurrency slot (it will expire): %s", exc)
