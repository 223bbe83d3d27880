"""What the prober learns of mail servers, kept by server IP address (as session slots
are): the recipients a session may carry (from a 452), the rejections a session may have
(from a hang-up or a tarpit after rejections), and whether the server refuses domains mixed
in one transaction. Limits are only ever lowered.

Each process keeps its lessons in bounded dicts (:data:`LEARNED_HOSTS` servers learnt of
last). With Redis (``VERIMAIL_REDIS_URL``) every lesson is also written to a small hash per
server, ``<prefix>:smtp-learned:<ip>`` (fields ``rcpt``, ``rejections``, ``one_domain``; the
lowest value kept, by a script, so two workers' lessons never raise each other's), which
lives :data:`LEARNED_TTL` after its last lesson; and a process reads a server's hash before
its sessions there, at most every :data:`REFRESH_SECONDS`. So what one worker learns,
the others use from their next session at that server instead of each paying its own
452s and hang-ups.

Redis failures fail *open* to the process's own lessons for
:data:`~verimail.engine.leases.RETRY_SECONDS` (one warning is logged), as the session
slots do: an outage of the shared store must not stop verification. Writes go through a
small thread pool, so a session that learns never waits on Redis; reads run in a worker
thread (the client is the synchronous one, shared safely between threads and event loops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from verimail.engine.leases import FailOpen

log = logging.getLogger("verimail.engine.smtp.learned")

LEARNED_HOSTS = 50_000
"""Servers a process keeps lessons of (the newest): one that meets millions of servers over
time must not keep an entry for each of them."""
LEARNED_TTL = 24 * 3600
"""Seconds a server's shared lessons live in Redis after its last one (a server changes
its limits rarely; one that raised them is asked at the settings' limits again a day on)."""
REFRESH_SECONDS = 5.0
"""A process reads a server's shared lessons at most this often (one Redis round trip)."""

_LOWER_SCRIPT = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current or tonumber(ARGV[2]) < tonumber(current) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""
"""Keep the lower of the stored value and ARGV[2] in field ARGV[1]; renew the TTL."""

_FIELDS = ("rcpt", "rejections", "one_domain")

# Lessons are written from here: a small pool, so a session never waits on Redis.
_WRITES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verimail-learned")


class _Bounded(dict):  # type: ignore[type-arg]
    """A dict of the :data:`LEARNED_HOSTS` keys set last."""

    def __setitem__(self, key: object, value: object) -> None:
        self.pop(key, None)  # (re-learnt: now the newest)
        super().__setitem__(key, value)
        if len(self) > LEARNED_HOSTS:
            del self[next(iter(self))]


class LearnedLimits:
    """Lessons of servers by IP address: the process's own, shared through Redis when a
    URL is given (see the module docstring)."""

    def __init__(self, redis_url: str | None, prefix: str = "verimail") -> None:
        self._lessons: dict[str, dict[str, int]] = {name: _Bounded() for name in _FIELDS}
        self._read_at: dict[str, float] = _Bounded()  # server -> monotonic time of last read
        self._prefix = prefix
        self._client = None
        self._lower = None
        self._outage = FailOpen(
            log, "SMTP lessons in Redis failed; each process keeps its own for %d s: %s"
        )
        if redis_url:
            import redis

            self._client = redis.Redis.from_url(
                redis_url, socket_timeout=2, socket_connect_timeout=2
            )
            self._lower = self._client.register_script(_LOWER_SCRIPT)

    # ------------------------------------------------------------------ reading
    def rcpt_limit(self, server: str) -> int | None:
        """Recipients a session may carry at ``server``, if learnt."""
        return self._lessons["rcpt"].get(server)

    def rejection_limit(self, server: str) -> int | None:
        """Rejections a session may have at ``server``, if learnt."""
        return self._lessons["rejections"].get(server)

    def one_domain(self, server: str) -> bool:
        """``server`` refuses recipients of several domains in one transaction."""
        return server in self._lessons["one_domain"]

    # ------------------------------------------------------------------ learning
    def lower_rcpt_limit(self, server: str, limit: int) -> None:
        self._learn("rcpt", server, limit)

    def lower_rejection_limit(self, server: str, limit: int) -> None:
        self._learn("rejections", server, limit)

    def mark_one_domain(self, server: str) -> None:
        self._learn("one_domain", server, 1)

    def _learn(self, name: str, server: str, value: int) -> None:
        lessons = self._lessons[name]
        lessons[server] = min(value, lessons.get(server, value))
        if self._lower is None or self.down:
            return
        key = self.key(server)

        def write() -> None:
            try:
                self._lower(keys=[key], args=[name, value, LEARNED_TTL])  # type: ignore[misc]
            except Exception as exc:  # this process keeps it; others learn it themselves
                self._failed(exc)

        _WRITES.submit(write)

    # ------------------------------------------------------------------ sharing
    def key(self, server: str) -> str:
        return f"{self._prefix}:smtp-learned:{server}"

    @property
    def down(self) -> bool:
        """Redis failed less than :data:`~verimail.engine.leases.RETRY_SECONDS` ago: it is
        not asked meanwhile."""
        return self._outage.down

    async def refresh(self, servers: Iterable[str]) -> None:
        """Take in what other processes learnt of ``servers`` (those not read in the last
        :data:`REFRESH_SECONDS`), lowering this process's limits to theirs; never raises."""
        if self._client is None or self.down:
            return
        now = time.monotonic()
        due = [
            server
            for server in dict.fromkeys(servers)
            if now - self._read_at.get(server, -REFRESH_SECONDS) >= REFRESH_SECONDS
        ]
        if not due:
            return
        for server in due:
            self._read_at[server] = now
        try:
            shared = await asyncio.to_thread(self._read, due)
        except Exception as exc:
            self._failed(exc)
            return
        for server, fields in zip(due, shared, strict=True):
            for name, raw in fields.items():
                name = name.decode() if isinstance(name, bytes) else str(name)
                if name in self._lessons:
                    lessons = self._lessons[name]
                    value = int(raw)
                    lessons[server] = min(value, lessons.get(server, value))

    def _read(self, servers: list[str]) -> list[dict[bytes, bytes]]:
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        for server in servers:
            pipe.hgetall(self.key(server))
        return pipe.execute()

    def _failed(self, exc: Exception) -> None:
        self._outage.failed(exc)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
