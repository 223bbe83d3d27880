"""The shared state of one host group's run: the recipients queued to ask, what they were
found to be, the hosts dropped on the way. The prober's workers share one run; so do the
lookups a finder makes through one domain session."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from verimail.engine.smtp.egress import Egress
from verimail.engine.smtp.findings import Finding, GroupResult, HostGroup
from verimail.schemas.outcomes import SmtpOutcome

MAX_ATTEMPTS = 3  # tries of one recipient across broken sessions before giving up


@dataclass
class Recipient:
    """A recipient to ask about (or the catch-all probe of its domain), with its tries."""

    domain: str
    rcpt: str
    is_probe: bool = False
    attempts: int = 0


@dataclass
class GroupRun:
    """Shared state of one group's run."""

    group: HostGroup
    queue: deque[Recipient]
    result: GroupResult
    retry_later: list[Recipient] = field(default_factory=list)
    dead_hosts: set[str] = field(default_factory=set)
    broken: dict[str, int] = field(default_factory=dict)  # sessions lost in a row, by host
    failures: list[Finding] = field(default_factory=list)  # why hosts were dropped mid-run
    workers: int = 0  # this run's workers still at work (opening or holding a session)
    greeted: set[str] = field(default_factory=set)  # hosts that gave this run a session
    spawn: Callable[[], None] | None = None  # starts one more worker (while draining)
    crowded: bool = False  # a server turned a session away for now: start no more
    per_session: int | None = None  # recipients a session got through before ending early
    egress: Egress | None = None  # where its sessions leave from (None: the prober's choice)

    def session_broke(self, host: str, finding: Finding) -> None:
        """Count a lost session; drop the host from this run after ``MAX_ATTEMPTS`` in a row."""
        self.broken[host] = self.broken.get(host, 0) + 1
        if self.broken[host] >= MAX_ATTEMPTS and host not in self.dead_hosts:
            self.dead_hosts.add(host)
            self.failures.append(finding)

    def record(self, item: Recipient, finding: Finding) -> None:
        """Keep ``finding`` as the answer about ``item`` (for a probe: the domain's catch-all)."""
        result = self.result
        if item.is_probe:
            result.catch_all_findings[item.domain] = finding
            if finding.outcome is SmtpOutcome.ACCEPTED:
                result.catch_all[item.domain] = True
            elif finding.outcome is SmtpOutcome.NO_MAILBOX:
                result.catch_all[item.domain] = False
            else:
                result.catch_all[item.domain] = None
        else:
            result.findings[item.rcpt] = finding

    def put_back(self, items: list[Recipient], last: Recipient | None) -> None:
        """Return a claim's unasked ``items`` to the front of the queue, behind ``last`` when
        the session ended under it and it went back first: it is asked first in the next
        session. Behind the others it came after a rejection again, and a tarpit timed it
        out again, until its tries were spent (9 of 200 addresses unknown in review)."""
        queue = self.queue
        head = queue.popleft() if last is not None and queue and queue[0] is last else None
        queue.extendleft(reversed(items))
        if head is not None:
            queue.appendleft(head)

    def ask_again(self, item: Recipient, host: str, finding: Finding) -> None:
        """Ask ``item`` again after its session broke: on the next MX host, uncounted, when
        that break dropped ``host`` (with none left every item gets the failure); else in a
        new session, counting the try (:meth:`_retry`)."""
        if host in self.dead_hosts:
            self.queue.appendleft(item)
        else:
            self._retry(item, finding)

    def _retry(self, item: Recipient, finding: Finding) -> None:
        item.attempts += 1
        self.result.stats.retries += 1
        if item.attempts >= MAX_ATTEMPTS:
            self.record(item, finding)
        else:
            self.queue.appendleft(item)
