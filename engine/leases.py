"""Leases in Redis: a capped set of holders that survives no crash.

A key is a sorted set whose members are the holders, each scored by its lease's expiry.
Taking a lease sweeps the expired members and adds one only under the cap, in one Lua
script, so check-and-add is atomic across processes; a holder renews its lease while it
runs, and a process that dies stops renewing, so its leases lapse instead of leaking.
Used for the API's per-account concurrency (:mod:`verimail.api.ratelimit`) and for SMTP
politeness per mail host (:mod:`verimail.engine.smtp.host_slots`). :class:`FailOpen` is
how the engine's Redis users (those slots, and the lessons of
:mod:`verimail.engine.smtp.learned`) ride out an outage.
"""

from __future__ import annotations

import logging
import time

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

    def __init__(self, log: logging.Logger, warning: str) -> None:
        self._log = log
        self._warning = warning  # (%d: the seconds; %s: the error)
        self._until = 0.0  # monotonic: Redis is not asked until then

    @property
    def down(self) -> bool:
        return time.monotonic() < self._until

    def failed(self, exc: Exception) -> None:
        if not self.down:
            self._log.warning(self._warning, RETRY_SECONDS, exc)
        self._until = time.monotonic() + RETRY_SECONDS
