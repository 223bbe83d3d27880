"""Egresses cooled down for a mail server that refused them (blocked-egress detection).

When a server refuses our *sending IP* — a blocklist named in a reply, a 554 banner,
repeated resets before its greeting — asking it again through the same egress only earns
more refusals and can lengthen the listing. So that egress is cooled down for that server
IP for ``smtp_egress_cooldown`` seconds: no session goes there through it meanwhile, and
the addresses end ``unknown``/``egress_blocked`` at once (or go through the next route,
where routes are configured). A cool-down is per (egress name, server IP): ``direct`` when
no proxy is used, a proxy's name otherwise — one egress's listing says nothing of another's.

With Redis (``VERIMAIL_REDIS_URL``) a cool-down holds for the whole fleet, as the host
slots do (:mod:`~verimail.engine.smtp.host_slots`): a key that expires on its own, so
nothing has to clean up. Redis failures fail open to this process's memory for
:data:`RETRY_SECONDS`: an outage of the counter store must not stop verification.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from verimail.engine.smtp.findings import DIRECT, Finding, GroupResult, HostGroup
from verimail.engine.smtp.session import GREETING_RESETS
from verimail.schemas.outcomes import SmtpOutcome

log = logging.getLogger("verimail.engine.smtp.egress_cooldown")

__all__ = ["DIRECT", "EgressCooldown", "refused_ip", "reset_out"]


def reset_out(host: str) -> Finding:
    """The finding of a server that reset :data:`GREETING_RESETS` connections in a row
    before its greeting: it turns our IP away."""
    return Finding(
        SmtpOutcome.EGRESS_BLOCKED,
        f"{host} dropped the connection before its greeting {GREETING_RESETS} times in "
        "a row: it turns our sending IP away",
        host,
    )


def refused_ip(group: HostGroup, result: GroupResult, egress: str) -> list[str]:
    """The domains of ``group`` whose server refused ``egress``'s IP in ``result``: one
    of their recipients (or the catch-all probe) is egress_blocked through it."""
    refused = []
    for domain, rcpts in group.domains.items():
        answers = [result.findings.get(rcpt) for rcpt in rcpts]
        answers.append(result.catch_all_findings.get(domain))
        if any(
            a is not None and a.outcome is SmtpOutcome.EGRESS_BLOCKED and a.egress == egress
            for a in answers
        ):
            refused.append(domain)
    return refused


RETRY_SECONDS = 30
"""After Redis fails, only this process's memory is asked for this long."""


class EgressCooldown:
    """Which (egress, server IP) pairs are cooling down, and why (the server's reply)."""

    def __init__(self, seconds: float, redis_url: str | None, prefix: str = "verimail") -> None:
        self.seconds = seconds
        self.prefix = prefix
        self._local: dict[tuple[str, str], tuple[float, str]] = {}  # -> (until, reason)
        self._lock = threading.Lock()
        self._client: Any = None
        self._down_until = 0.0
        if redis_url:
            import redis

            self._client = redis.Redis.from_url(
                redis_url, socket_timeout=2, socket_connect_timeout=2
            )

    def _key(self, egress: str, address: str) -> str:
        return f"{self.prefix}:egress-cooldown:{egress}:{address}"

    async def cool(self, egress: str, address: str, reason: str) -> None:
        """``egress`` was refused by the server at ``address``: leave it alone for a while."""
        if self.seconds <= 0:
            return
        with self._lock:
            self._local[(egress, address)] = (time.monotonic() + self.seconds, reason)
        if self._redis_usable():
            await asyncio.to_thread(self._redis_set, egress, address, reason)

    async def cooling(self, egress: str, address: str) -> str | None:
        """Why ``egress`` is cooling down for ``address`` (the refusal), or None."""
        if self.seconds <= 0:
            return None
        with self._lock:
            held = self._local.get((egress, address))
            if held is not None:
                if held[0] > time.monotonic():
                    return held[1]
                del self._local[(egress, address)]
        if self._redis_usable():
            return await asyncio.to_thread(self._redis_get, egress, address)
        return None

    def _redis_usable(self) -> bool:
        return self._client is not None and time.monotonic() >= self._down_until

    def _redis_set(self, egress: str, address: str, reason: str) -> None:
        try:
            self._client.set(self._key(egress, address), reason, ex=max(1, round(self.seconds)))
        except Exception as exc:
            self._redis_failed(exc)

    def _redis_get(self, egress: str, address: str) -> str | None:
        try:
            value = self._client.get(self._key(egress, address))
        except Exception as exc:
            self._redis_failed(exc)
            return None
        return value.decode("utf-8", "replace") if value is not None else None

    def _redis_failed(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + RETRY_SECONDS
        log.warning(
            "egress cool-downs in Redis failed; this process keeps its own for %d s: %s",
            RETRY_SECONDS,
            exc,
        )
