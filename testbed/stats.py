"""Counters of what clients did to the testbed, written by its loop thread and read by tests.

Every mutation and every read takes one lock, and reads return copies, so a test thread never
sees a half-updated ``HostStats`` while the servers keep running.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace


@dataclass
class HostStats:
    """What one SMTP host saw; ``rcpts`` lists every ``RCPT TO`` address in arrival order."""

    sessions: int = 0
    mail_from: int = 0
    rcpt_to: int = 0
    data: int = 0
    starttls: int = 0
    peak_concurrent: int = 0
    active: int = 0
    rejections: int = 0
    hangups: int = 0  # sessions the server closed itself (``disconnect_after_rejections``)
    peak_session_rejections: int = 0  # the most rejections one session reached
    rcpts: list[str] = field(default_factory=list)

    def copy(self) -> HostStats:
        """A snapshot that later server activity does not change."""
        return replace(self, rcpts=list(self.rcpts))


class StatsRegistry:
    """Thread-safe counters for DNS queries and SMTP host activity."""

    def __init__(self) -> None:
        # Re-entrant, so that a ``wait_until`` predicate may read snapshots while waiting.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._dns: Counter[tuple[str, str]] = Counter()
        self._hosts: dict[str, HostStats] = {}
        self._active_total = 0
        self._peak_total = 0

    def _host(self, name: str) -> HostStats:
        stats = self._hosts.get(name)
        if stats is None:
            stats = self._hosts[name] = HostStats()
        return stats

    # ------------------------------------------------------------------ writers (loop thread)
    def dns_query(self, qname: str, rdtype: str) -> None:
        with self._changed:
            self._changed.notify_all()
            self._dns[(qname, rdtype)] += 1

    def session_opened(self, host: str) -> None:
        with self._changed:
            self._changed.notify_all()
            stats = self._host(host)
            stats.sessions += 1
            stats.active += 1
            stats.peak_concurrent = max(stats.peak_concurrent, stats.active)
            self._active_total += 1
            self._peak_total = max(self._peak_total, self._active_total)

    def session_closed(self, host: str) -> None:
        with self._changed:
            self._changed.notify_all()
            self._host(host).active -= 1
            self._active_total -= 1

    def count(self, host: str, what: str) -> None:
        """Add one to the integer field ``what`` (mail_from, data, starttls, rejections,
        hangups)."""
        with self._changed:
            self._changed.notify_all()
            stats = self._host(host)
            setattr(stats, what, getattr(stats, what) + 1)

    def session_rejections(self, host: str, rejections: int) -> None:
        """A session of ``host`` has now had ``rejections`` rejections."""
        with self._changed:
            self._changed.notify_all()
            stats = self._host(host)
            stats.peak_session_rejections = max(stats.peak_session_rejections, rejections)

    def rcpt(self, host: str, address: str) -> None:
        with self._changed:
            self._changed.notify_all()
            stats = self._host(host)
            stats.rcpt_to += 1
            stats.rcpts.append(address)

    # ------------------------------------------------------------------ readers (any thread)
    def dns_queries(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self._dns)

    def host(self, name: str) -> HostStats:
        with self._lock:
            stats = self._hosts.get(name)
            return stats.copy() if stats else HostStats()

    def total(self) -> HostStats:
        """Sums over all hosts; ``peak_concurrent`` is the peak of simultaneous sessions overall."""
        with self._lock:
            total = HostStats()
            for stats in self._hosts.values():
                for name in (
                    "sessions",
                    "mail_from",
                    "rcpt_to",
                    "data",
                    "starttls",
                    "rejections",
                    "hangups",
                ):
                    setattr(total, name, getattr(total, name) + getattr(stats, name))
                total.rcpts.extend(stats.rcpts)
                total.peak_session_rejections = max(
                    total.peak_session_rejections, stats.peak_session_rejections
                )
            total.active = self._active_total
            total.peak_concurrent = self._peak_total
            return total

    def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate()`` holds, re-checking at every counter change."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no SMTP session is open; False if ``timeout`` passed first."""
        return self.wait_until(lambda: self._active_total == 0, timeout)

    def reset(self) -> None:
        """Zero everything; sessions still open keep counting as active (peaks restart there)."""
        with self._changed:
            self._changed.notify_all()
            self._dns.clear()
            for name, stats in list(self._hosts.items()):
                self._hosts[name] = HostStats(active=stats.active, peak_concurrent=stats.active)
            self._peak_total = self._active_total
