"""The SMTP prober: many ``RCPT TO`` per session, grouped by mail host. Never ``DATA``.

Why one long file: a session's conversation (connect, EHLO, STARTTLS, MAIL, the RCPTs, the
catch-all probe, RSET, a fresh connection at the server's limits) is one state machine whose
steps share the session's state; split, it would be read in pieces.

A *host group* is every domain served by the same MX hosts. For each group the prober
opens at most ``smtp_max_sessions_per_host`` sessions (and no more than the work needs;
the cap holds per server IP address across every group and MX name that reach it),
and each session walks a shared queue of recipients ordered by domain:

- ``MAIL FROM`` once per session: recipients of all the group's domains share one
  transaction (a host that refuses the mix gets ``RSET`` + ``MAIL FROM`` per domain);
- first item of each domain is a random-address probe that decides catch-all;
- a fresh session after ``smtp_rcpts_per_session`` recipients or
  ``smtp_max_rejections_per_session`` rejections (Postfix slows down after 10 errors and
  drops the session after 20);
- ``452`` too many recipients: new session, and the host's recipients-per-session limit is
  lowered to the RCPTs the connection took (down to one recipient per session for strict
  providers); the recipient goes first into the next session, its tries untouched;
- ``421``, a dropped connection or a timeout mid-session: the recipient goes back in the
  queue for a new session (at most ``MAX_ATTEMPTS`` tries), never a verdict; after
  rejections, a hang-up or a timeout (a tarpit) is the host's error limit instead: learnt,
  and the recipient's try is not counted;
- sessions that end early (rejections, hang-ups) start more sessions, up to the cap;
- a server that turns a session away with "too many connections" while this process has
  sessions there: later sessions queue for those to end (``HostSlots.learn_cap``);
- a reply code outside 2xx-5xx (``999``) breaks the session like one that is no number;
- a host that breaks ``MAX_ATTEMPTS`` sessions in a row without answering one recipient
  (a tarpit, a server that resets or speaks garbage) is dropped for the rest of the run and
  its remaining recipients go to the next MX host or end with that failure — otherwise each
  recipient would cost up to ``MAX_ATTEMPTS`` command timeouts;
- ``450``/``451`` greylisting: retried after the queue drains, with back-off doubling from
  ``smtp_greylist_delay``, ``smtp_greylist_retries`` times, then ``unknown``.

Connections go to MX hosts in preference order, falling back on refusal, timeout or a
``421``/``5xx`` greeting, and only to addresses ``netguard`` allows; at most
``MAX_CONNECT_ATTEMPTS`` addresses are dialled to open one session (Postfix's
``smtp_mx_address_limit``), so a domain with hundreds of MX hosts or addresses cannot turn
one lookup into hundreds of connection attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiosmtplib
from aiosmtplib.errors import (
    SMTPConnectResponseError,
    SMTPException,
    SMTPResponseException,
    SMTPTimeoutError,
)

from verimail.config import Settings
from verimail.engine import metrics
from verimail.engine.dns_facts import MailHost
from verimail.engine.netguard import connect_allowed
from verimail.engine.smtp.host_slots import HeldSlots, HostSlots
from verimail.engine.smtp.replies import classify_rcpt, enhanced_code, one_line
from verimail.schemas.outcomes import SmtpOutcome

_REPLY = re.compile(r"[2-5][0-9][0-9](?: |$)")  # as one_line writes a reply
MAX_ATTEMPTS = 3  # tries of one recipient across broken sessions before giving up
MAX_CONNECT_ATTEMPTS = 5  # addresses dialled to open one session, all MX hosts together


def probe_address(domain: str, sender: str) -> str:
    """The made-up address that decides catch-all: random-looking, but the same for a
    (sender, domain) pair, so the retry of a greylisted probe asks about the same
    greylist triplet (a fresh random one would be greylisted anew at every try)."""
    digest = hashlib.sha256(f"verimail-probe\0{sender}\0{domain}".encode()).hexdigest()
    return f"vm-probe-{digest[:12]}@{domain}"


@dataclass(frozen=True)
class Finding:
    """What the mail host said about one recipient."""

    outcome: SmtpOutcome
    response: str | None = None  # the reply ("550 5.1.1 …"), or what happened instead
    host: str | None = None

    @property
    def reply(self) -> str | None:
        """``response`` when it is an SMTP reply, None when there was none (a timeout, a
        lost connection, a private MX not contacted): SPEC §2.2's ``smtp_response`` is null
        then, and our own wording (with the MX's address in it) is not passed off as the
        server's."""
        return self.response if self.response and _REPLY.match(self.response) else None


@dataclass
class HostGroup:
    """Domains that share MX hosts, with the recipients to check on each."""

    hosts: tuple[MailHost, ...]
    domains: dict[str, list[str]]  # domain -> recipient addresses (normalised, unique)
    probe_catch_all: bool = True

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.domains.values()) + (
            len(self.domains) if self.probe_catch_all else 0
        )


@dataclass
class SmtpStats:
    """What the prober did, for the engine's stats and the benchmarks."""

    sessions: int = 0
    rcpts: int = 0
    mail_from: int = 0
    retries: int = 0
    catch_all_probes: int = 0
    connect_failures: int = 0

    def add(self, other: SmtpStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class GroupResult:
    findings: dict[str, Finding] = field(default_factory=dict)  # by recipient address
    catch_all: dict[str, bool | None] = field(default_factory=dict)  # by domain
    catch_all_findings: dict[str, Finding] = field(default_factory=dict)
    stats: SmtpStats = field(default_factory=SmtpStats)


@dataclass
class _Item:
    domain: str
    rcpt: str
    is_probe: bool = False
    attempts: int = 0


class _Stopped(Exception):
    """Work on a recipient stopped with ``finding`` (what the subclasses say happened)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.response)
        self.finding = finding


class _SessionLost(_Stopped):
    """The session broke mid-way (421, disconnect, timeout): retry elsewhere."""


class _NotAsked(_Stopped):
    """The recipient was not asked about: the server refused our ``MAIL FROM``, or cannot
    take the address at all (a non-ASCII local part without SMTPUTF8). Nothing was learnt
    of the mailbox, and the session is not charged a rejection."""


class _SenderRefused(_NotAsked):
    """The host refused our ``MAIL FROM``: it will refuse it for every recipient, so the
    host is done for this run (each further recipient would cost one more refused command,
    and Postfix hangs up after 20 errors)."""


def _sender_refused(code: int, message: str, host: str) -> _SenderRefused:
    """A refused sender is never "no such mailbox" (a 5.1.x there is about *our* address):
    5xx reads as blocked, 4xx as a temporary failure — both unknown."""
    outcome = SmtpOutcome.BLOCKED if code >= 500 else SmtpOutcome.TEMP_FAILURE
    return _SenderRefused(Finding(outcome, one_line(code, message), host))


def _too_many_recipients(code: int, message: str, earlier: int) -> bool:
    """A 452 that asks for a new session: ``earlier`` recipients of this session were
    answered, and it says so (4.5.3, "too many recipients") or says nothing more. Never
    on a session's first recipient (a limit of none cannot be learnt: that is a temporary
    failure, retried within bounds) nor for a full mailbox (``452 4.2.2 … over quota``)."""
    if code != 452 or earlier <= 0:
        return False
    enhanced = enhanced_code(message)
    return enhanced is None or enhanced == (4, 5, 3) or "too many" in message.lower()


class _AskAgain(_Stopped):
    """The recipient must be asked again, in a later session (it was not answered here)."""


class _NoSession(_Stopped):
    """No MX host of the group could be reached: the finding applies to all its work."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding)
        metrics.SMTP_SESSIONS_REFUSED.labels(reason=finding.outcome.value).inc()


CROWDED_WAITS = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds the last worker of a run waits before dialling again a host that refused it for
now while no session of this process is there but it gave this run one before: a server's
count of connections may lag our QUIT, and other machines' sessions end. (While this
process has sessions there, the worker queues for their slots instead:
:meth:`~verimail.engine.smtp.host_slots.HostSlots.learn_cap`.)"""


class _Learned(dict):  # type: ignore[type-arg]
    """What the prober learnt of hosts (recipient and rejection limits, no mixing), kept
    for the :data:`LEARNED_HOSTS` hosts learnt of last: a process that meets millions of
    hosts over time must not keep an entry for each of them."""

    def __setitem__(self, key: object, value: object) -> None:
        self.pop(key, None)  # (re-learnt: now the newest)
        super().__setitem__(key, value)
        if len(self) > LEARNED_HOSTS:
            del self[next(iter(self))]


LEARNED_HOSTS = 50_000


# How a server at its limit of connections at once turns one more away: a 421 banner, or
# closing the connection before (or while) it sends one.
_REFUSED_FOR_NOW = (SmtpOutcome.TEMP_FAILURE, SmtpOutcome.CONNECTION_FAILED)


# RCPT TO answers that say the mailbox is there: the finder stops at the first.
_MAILBOX_EXISTS = (SmtpOutcome.ACCEPTED, SmtpOutcome.MAILBOX_FULL)
# A 4xx to RCPT TO (once retries are spent): the server puts us off for now.
_PUT_OFF = (SmtpOutcome.GREYLISTED, SmtpOutcome.TEMP_FAILURE)


class _Crowded(_NoSession):
    """A new session was refused for now (4xx) while the run has others open: no verdict."""


@dataclass
class _Run:
    """Shared state of one group's run."""

    group: HostGroup
    queue: deque[_Item]
    result: GroupResult
    retry_later: list[_Item] = field(default_factory=list)
    dead_hosts: set[str] = field(default_factory=set)
    broken: dict[str, int] = field(default_factory=dict)  # sessions lost in a row, by host
    failures: list[Finding] = field(default_factory=list)  # why hosts were dropped mid-run
    workers: int = 0  # this run's workers still at work (opening or holding a session)
    greeted: set[str] = field(default_factory=set)  # hosts that gave this run a session
    spawn: Callable[[], None] | None = None  # starts one more worker (while draining)
    crowded: bool = False  # a server turned a session away for now: start no more
    per_session: int | None = None  # recipients a session got through before ending early


# Answers to a domain's first recipient in a mixed transaction that may be a refusal of
# the mix itself rather than of the recipient (greylisting and 452/421 are handled apart).
_MIX_SUSPECT = (SmtpOutcome.BLOCKED, SmtpOutcome.REJECTED_OTHER, SmtpOutcome.TEMP_FAILURE)


class _Session:
    """One SMTP connection and the transaction state the prober needs."""

    def __init__(self, smtp: aiosmtplib.SMTP, host: MailHost, slots: HeldSlots) -> None:
        self.smtp = smtp
        self.host = host
        self._slots = slots
        self.in_tx = False  # a MAIL FROM was accepted and not yet reset
        self.tx_domains: set[str] = set()  # recipients' domains in the open transaction
        self.rcpts = 0
        self.rejections = 0
        self.smtputf8 = smtp.supports_extension("smtputf8")
        self.closed = False

    async def close(self, polite: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if polite and self.smtp.is_connected:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.smtp.execute_command(b"QUIT"), 2)
        finally:  # a run cancelled while saying QUIT must still hang up
            with contextlib.suppress(Exception):
                self.smtp.close()
            self._slots.release()


def _in_range(reply: aiosmtplib.SMTPResponse, session: _Session) -> aiosmtplib.SMTPResponse:
    """``reply``, unless its code is outside 2xx-5xx (``999``): that is no answer, just as
    a code that is no number is none (aiosmtplib raises on those). Both break the session,
    so the recipient is asked again and a host that keeps doing it is dropped for the next
    MX host, rather than its nonsense being recorded as every recipient's answer."""
    if 200 <= reply.code < 600:
        return reply
    raise _SessionLost(
        Finding(SmtpOutcome.PROTOCOL_ERROR, one_line(reply.code, reply.message), session.host.name)
    )


# How a session ends at a server's error limit after rejections: it hangs up, or it
# tarpits (every reply after a rejection slower than our command timeout). See _hung_up.
_SERVER_ENDED = (SmtpOutcome.CONNECTION_FAILED, SmtpOutcome.TIMEOUT)


def _put_back(queue: deque[_Item], items: list[_Item], last: _Item | None) -> None:
    """Return a claim's unasked ``items`` to the front of the queue, behind ``last`` when
    the session ended under it and it went back first: it is asked first in the next
    session. Behind the others it came after a rejection again, and a tarpit timed it out
    again, until its tries were spent (9 of 200 addresses unknown in review)."""
    head = queue.popleft() if last is not None and queue and queue[0] is last else None
    queue.extendleft(reversed(items))
    if head is not None:
        queue.appendleft(head)


def _tally(session: _Session, outcome: SmtpOutcome) -> None:
    """Count an answered recipient against the session's limits: a refused one against
    the rejections a server tolerates (every RCPT counts against the recipient cap as it
    is sent)."""
    if outcome is not SmtpOutcome.ACCEPTED:
        session.rejections += 1


class Prober:
    """Runs host groups; holds the politeness slots (:mod:`~verimail.engine.smtp.host_slots`)
    and the limits it learns."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slots = HostSlots(
            settings.smtp_max_sessions_per_host,
            settings.smtp_max_sessions_total,
            settings.redis_url,
        )
        self._rcpt_limit: dict[str, int] = _Learned()  # learned from 452
        self._rejection_limit: dict[str, int] = _Learned()  # learned from disconnects
        self._one_domain_hosts: dict[str, bool] = _Learned()  # will not mix domains per message

    def allowed_hosts(self, hosts: tuple[MailHost, ...]) -> tuple[MailHost, ...]:
        """The hosts with at least one address we may connect to (addresses filtered)."""
        allowed = self.settings.smtp_allow_networks
        kept = []
        for host in hosts:
            addresses = tuple(a for a in host.addresses if connect_allowed(a, allowed))
            if addresses:
                kept.append(MailHost(host.name, host.preference, addresses))
        return tuple(kept)

    async def run_group(
        self,
        group: HostGroup,
        *,
        result: GroupResult | None = None,
        greylist_retries: int | None = None,
    ) -> GroupResult:
        """Check every recipient of the group; one finding per recipient, never raises.

        ``result``, when given, is filled in as answers come, so a caller that stops the run
        at a deadline keeps what was learnt; ``greylist_retries`` overrides the setting (0: a
        synchronous call answers greylisting at once instead of waiting it out)."""
        result = result if result is not None else GroupResult()
        if greylist_retries is None:
            greylist_retries = self.settings.smtp_greylist_retries
        queue: deque[_Item] = deque()
        for domain, rcpts in group.domains.items():
            if group.probe_catch_all:
                probe = probe_address(domain, self.settings.smtp_mail_from)
                queue.append(_Item(domain, probe, is_probe=True))
            queue.extend(_Item(domain, rcpt) for rcpt in rcpts)
        run = _Run(group, queue, result)
        delay = self.settings.smtp_greylist_delay
        for round_no in range(greylist_retries + 1):
            if round_no:
                if not run.retry_later:
                    break
                await asyncio.sleep(delay)
                delay *= 2
                result.stats.retries += len(run.retry_later)
                run.queue.extend(run.retry_later)
                run.retry_later = []
            await self._drain(run)
        for domain in group.domains:
            result.catch_all.setdefault(domain, None)
        return result

    async def _drain(self, run: _Run) -> None:
        """Work the queue with as many sessions as it needs, up to the per-host cap: as
        many as full sessions would take to begin with, more as sessions end early
        (:meth:`_more_workers`)."""
        limit = self._session_rcpt_limit(run.group)
        workers = max(
            1, min(self.settings.smtp_max_sessions_per_host, math.ceil(len(run.queue) / limit))
        )
        tasks: list[asyncio.Future[None]] = []

        def spawn() -> None:
            run.workers += 1  # (counted now, so that a second call sees it)
            tasks.append(asyncio.ensure_future(self._worker(run)))

        run.spawn = spawn
        try:
            for _ in range(workers):
                spawn()
            while pending := [task for task in tasks if not task.done()]:
                await asyncio.gather(*pending)
            for task in tasks:  # (one that failed while another was awaited)
                task.result()
        finally:
            run.spawn = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _more_workers(self, run: _Run, session: _Session) -> None:
        """A session ended before its claim was done (the rejection limit, a hang-up, a
        452): from now on claims are what this session got through, and more workers start
        if what is left needs more sessions than are at work. The first count assumed full
        sessions (a list of 300 mostly invalid addresses on one host ran on 3 sessions of
        the 5 allowed)."""
        per_session = run.per_session = max(1, session.rcpts)
        if run.spawn is None or run.crowded:
            return
        wanted = min(
            self.settings.smtp_max_sessions_per_host, math.ceil(len(run.queue) / per_session)
        )
        while run.workers < wanted:
            run.spawn()

    def _session_rcpt_limit(self, group: HostGroup) -> int:
        learned = min((self._rcpt_limit.get(h.name, 10**9) for h in group.hosts), default=10**9)
        return max(1, min(self.settings.smtp_rcpts_per_session, learned))

    def _session_full(self, session: _Session) -> bool:
        name = session.host.name
        rcpt_limit = min(self.settings.smtp_rcpts_per_session, self._rcpt_limit.get(name, 10**9))
        rej_limit = min(
            self.settings.smtp_max_rejections_per_session,
            self._rejection_limit.get(name, 10**9),
        )
        return session.rcpts >= rcpt_limit or session.rejections >= rej_limit

    async def _worker(self, run: _Run) -> None:
        """Take a session's worth of recipients, then connect; repeat until none are left.

        Claiming before connecting means N workers open about ceil(recipients / limit)
        sessions rather than one each plus idle ones that found the queue empty.
        """
        session: _Session | None = None
        counted = True  # (counted in by _drain, until _dial_host counts it out as it leaves)
        try:
            while run.queue:
                if session is not None and (session.closed or self._session_full(session)):
                    await session.close()
                    session = None
                used = session.rcpts if session is not None else 0
                room = max(1, self._session_rcpt_limit(run.group) - used)
                if run.per_session is not None:  # (sessions end early: leave some to others)
                    room = min(room, run.per_session)
                claimed = [run.queue.popleft() for _ in range(min(room, len(run.queue)))]
                if not claimed:
                    break  # others took the rest while we were closing
                if session is None:
                    try:
                        session = await self._open(run)
                    except _Crowded:  # the sessions already open carry on with the queue
                        counted = False
                        run.queue.extendleft(reversed(claimed))
                        return
                    except _NoSession as failed:
                        for item in claimed + list(run.queue):
                            self._record(run, item, failed.finding)
                        run.queue.clear()
                        return
                for index, item in enumerate(claimed):
                    if session.closed or self._session_full(session):
                        _put_back(run.queue, claimed[index:], claimed[index - 1] if index else None)
                        self._more_workers(run, session)
                        break
                    await self._check(run, session, item)
        finally:
            if counted:
                run.workers -= 1
            if session is not None:
                await session.close()

    async def _check(self, run: _Run, session: _Session, item: _Item) -> None:
        stats = run.result.stats
        try:
            code, message = await self._rcpt(session, item, stats)
        except _SenderRefused as refused:
            # This host will not take our sender: drop it for the run (the next MX host is
            # tried; with none left, every item gets this finding) and ask again elsewhere.
            await session.close()
            host = session.host.name
            if host not in run.dead_hosts:
                run.dead_hosts.add(host)
                run.failures.append(refused.finding)
            run.queue.appendleft(item)
            return
        except _NotAsked as refused:
            self._record(run, item, refused.finding)
            return
        except _AskAgain:  # in a transaction of its own, in the next session
            run.queue.appendleft(item)
            return
        except _SessionLost as lost:
            ended = lost.finding.outcome in _SERVER_ENDED
            await self._cut_short(run, session, item, lost.finding, hung_up=ended)
            return
        host = session.host.name
        if code == 421:
            # Closing the session is no answer: it counts as a broken session, so a host that
            # only ever says 421 is dropped and the next MX host is asked (README: MX
            # fallback on refusal/timeout/421), as the finder's sessions already did. Unless
            # it hung up after rejections: that is its error limit, not a broken host.
            finding = Finding(SmtpOutcome.TEMP_FAILURE, one_line(code, message), host)
            await self._cut_short(run, session, item, finding, hung_up=True)
            return
        run.broken[host] = 0  # it answered: whatever broke before was not the host itself
        if _too_many_recipients(code, message, session.rcpts - 1):
            # No answer about the recipient, and no try of it either: it goes first in the
            # next session, where as the first RCPT it cannot be "too many". (The session
            # answered others before, so the queue still shrinks.)
            self._learn_rcpt_limit(session)
            await session.close()
            run.queue.appendleft(item)
            return
        outcome = classify_rcpt(code, message)
        finding = Finding(outcome, one_line(code, message), host)
        _tally(session, outcome)
        if outcome in (SmtpOutcome.GREYLISTED, SmtpOutcome.TEMP_FAILURE):
            run.retry_later.append(item)
        self._record(run, item, finding)

    async def _cut_short(
        self, run: _Run, session: _Session, item: _Item, finding: Finding, *, hung_up: bool
    ) -> None:
        """The session ended under ``item`` (a 421, a dropped connection, a timeout): after
        a hang-up at the host's error limit the item goes back uncounted (see
        :meth:`_hung_up`); otherwise the session counts as broken and the item is asked
        again (:meth:`_again`)."""
        await session.close(polite=False)
        if hung_up and self._hung_up(session):
            run.queue.appendleft(item)
            return
        self._broken(run, session.host.name, finding)
        self._again(run, item, session.host.name, finding)

    def _learn_rcpt_limit(self, session: _Session) -> None:
        """A 452 "too many recipients" after ``session.rcpts - 1`` RCPTs of this connection.

        Servers count differently: Postfix the recipients it accepted in the transaction,
        others every RCPT of the connection. The cap learnt here counts every RCPT of a
        session, and by that count the server took ``session.rcpts - 1`` — its limit or
        more, whichever way it counts, so never too low. (The recipients accepted in the
        transaction were too low on a server that counts the connection: rejections and
        earlier transactions count there too, and the cap came out at 2 for a limit of 5,
        3-5 times the sessions needed.) The lowest reading stands: a session opened under a
        higher cap may report a higher one after a lower one was learnt, and a cap too
        high only costs another 452 and a fresh session."""
        name = session.host.name
        learned = max(1, session.rcpts - 1)
        self._rcpt_limit[name] = min(learned, self._rcpt_limit.get(name, learned))

    def _hung_up(self, session: _Session) -> bool:
        """The server ended the session (421 or a disconnect) or stopped answering within
        the command timeout (a tarpit, slowing every reply after a rejection). After some
        rejections that is its error limit (True): it hangs up at (or right after) that
        many, or slows down beyond our patience, so from now on
        sessions on this host end one rejection before, and it never has to (ending *at*
        that many raced its hang-up). Such a hang-up is no broken host: it answered every
        recipient before, and counting it as one let the sessions that were already under
        way, all cut at once, write the host off for the run (287 of 300 addresses
        "unknown" on a host that hangs up at its third rejection). Nor is it the
        recipient's try: it goes back in the queue uncounted, and since such a session
        answered at least one recipient, the queue still shrinks. A session that started
        before the limit was learned keeps the lowest limit seen."""
        if not session.rejections:
            return False
        name = session.host.name
        limit = max(1, session.rejections - 1)
        self._rejection_limit[name] = min(limit, self._rejection_limit.get(name, limit))
        return True

    @staticmethod
    def _broken(run: _Run, host: str, finding: Finding) -> None:
        """Count a lost session; drop the host from this run after ``MAX_ATTEMPTS`` in a row."""
        run.broken[host] = run.broken.get(host, 0) + 1
        if run.broken[host] >= MAX_ATTEMPTS and host not in run.dead_hosts:
            run.dead_hosts.add(host)
            run.failures.append(finding)

    def _again(self, run: _Run, item: _Item, host: str, finding: Finding) -> None:
        """Ask ``item`` again after its session broke: on the next MX host, uncounted, when
        that break dropped ``host`` (with none left every item gets the failure); else in a
        new session, :func:`_retry` counting the try."""
        if host in run.dead_hosts:
            run.queue.appendleft(item)
        else:
            self._retry(run, item, finding)

    def _retry(self, run: _Run, item: _Item, finding: Finding) -> None:
        item.attempts += 1
        run.result.stats.retries += 1
        if item.attempts >= MAX_ATTEMPTS:
            self._record(run, item, finding)
        else:
            run.queue.appendleft(item)

    def _record(self, run: _Run, item: _Item, finding: Finding) -> None:
        result = run.result
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

    async def _rcpt(self, session: _Session, item: _Item, stats: SmtpStats) -> tuple[int, str]:
        """Send ``RCPT TO``, opening a transaction (``MAIL FROM``) first when needed.

        Recipients of several domains share one transaction, as SMTP allows, which saves
        ``RSET`` + ``MAIL FROM`` (two round trips) per domain. A host that answers the
        first recipient of a joining domain with a policy refusal, another unreadable 5xx
        or a temporary error may be refusing the mix itself: the recipient is asked again
        in a transaction of its own, and the host gets one domain per transaction from
        then on. ``smtp_mix_domains = false`` never mixes.
        """
        needs_utf8 = not item.rcpt.isascii()
        if needs_utf8 and not session.smtputf8:
            # No reply to quote: the server was not asked (it cannot be, without SMTPUTF8).
            raise _NotAsked(Finding(SmtpOutcome.NOT_ATTEMPTED, "", session.host.name))
        try:
            joins = session.in_tx and item.domain not in session.tx_domains
            if not session.in_tx or (joins and not self._mixes(session)):
                refused = await self._mail_from(session, stats)
                if refused is not None:
                    raise _sender_refused(*refused, session.host.name)
                joins = False
            code, message = await self._send_rcpt(session, item, stats)
            suspect = code not in (421, 452) and classify_rcpt(code, message) in _MIX_SUSPECT
            if joins and suspect:
                self._one_domain_hosts[session.host.name] = True
                if self._session_full(session):  # (asking again here would pass the cap)
                    raise _AskAgain(Finding(SmtpOutcome.NOT_ATTEMPTED, "", session.host.name))
                refused = await self._mail_from(session, stats)
                if refused is not None:
                    raise _sender_refused(*refused, session.host.name)
                code, message = await self._send_rcpt(session, item, stats)
            return code, message
        except _Stopped:
            raise
        except SMTPTimeoutError as exc:
            raise _SessionLost(
                Finding(
                    SmtpOutcome.TIMEOUT,
                    f"timed out waiting for the server: {exc}",
                    session.host.name,
                )
            ) from exc
        except SMTPResponseException as exc:
            raise _SessionLost(
                Finding(
                    SmtpOutcome.PROTOCOL_ERROR, one_line(exc.code, exc.message), session.host.name
                )
            ) from exc
        except (SMTPException, OSError) as exc:
            raise _SessionLost(
                Finding(SmtpOutcome.CONNECTION_FAILED, f"connection lost: {exc}", session.host.name)
            ) from exc

    def _mixes(self, session: _Session) -> bool:
        return self.settings.smtp_mix_domains and session.host.name not in self._one_domain_hosts

    async def _mail_from(self, session: _Session, stats: SmtpStats) -> tuple[int, str] | None:
        """Open a fresh transaction (``RSET`` first if one is open); the reply if refused."""
        smtp = session.smtp
        if session.in_tx:
            await smtp.execute_command(b"RSET")
            session.in_tx = False
        session.tx_domains.clear()
        args = [b"FROM:<" + self.settings.smtp_mail_from.encode() + b">"]
        if session.smtputf8:
            args.append(b"SMTPUTF8")
        stats.mail_from += 1
        reply = _in_range(await smtp.execute_command(b"MAIL", *args), session)
        if reply.code == 421:
            raise _SessionLost(self._lost(session, reply.code, reply.message))
        if not 200 <= reply.code < 300:
            return reply.code, reply.message
        session.in_tx = True
        return None

    async def _send_rcpt(self, session: _Session, item: _Item, stats: SmtpStats) -> tuple[int, str]:
        session.tx_domains.add(item.domain)
        stats.rcpts += 1
        session.rcpts += 1
        if item.is_probe:
            stats.catch_all_probes += 1
        reply = await session.smtp.execute_command(b"RCPT", b"TO:<" + item.rcpt.encode() + b">")
        reply = _in_range(reply, session)
        return reply.code, reply.message

    def _lost(self, session: _Session, code: int, message: str) -> Finding:
        return Finding(SmtpOutcome.TEMP_FAILURE, one_line(code, message), session.host.name)

    async def _open(self, run: _Run) -> _Session:
        """Connect to the best reachable MX host; raise ``_NoSession`` when none answers.

        The host's politeness slot is taken before the process-wide one, so a worker
        queued behind a busy host never holds a global slot while it waits.
        """
        failures: list[Finding] = []
        dialled = 0
        for host in run.group.hosts:
            if host.name in run.dead_hosts:
                continue
            for address in host.addresses:
                if dialled >= MAX_CONNECT_ATTEMPTS:
                    raise _NoSession(_summarise(run.failures + failures))
                dialled += 1
                session = await self._dial_host(run, host, address, failures)
                if session is not None:
                    return session
            run.dead_hosts.add(host.name)
        raise _NoSession(_summarise(run.failures + failures))

    async def _dial_host(
        self, run: _Run, host: MailHost, address: str, failures: list[Finding]
    ) -> _Session | None:
        """A session with ``host`` at ``address``, or None (the failure noted in ``failures``).

        A 4xx banner ("421 too many connections"), or a connection closed before its
        banner, from a server that is not down — other workers of this run are at it, or it
        gave this run a session before and still counts that one, just closed, or other
        runs' sessions hold it — is the server's limit on connections at once: the worker
        stops for the others to carry on (:class:`_Crowded`) or, the last one, queues for
        the slot of the next session of this process there to end (other host groups and
        jobs sharing the server: it used to wait a fixed 15.5 s while they kept winning the
        one connection, then wrote the host off), or with none there waits a moment and
        dials again (:data:`CROWDED_WAITS`). A host that is down fails the last worker as
        before."""
        waits = iter(CROWDED_WAITS)
        while True:
            held = await self.slots.take(address)  # (per server: names may share one)
            try:
                smtp = await self._connect(host, address, run.result.stats)
            except _NoSession as failed:
                held.release()
                run.result.stats.connect_failures += 1
                if failed.finding.outcome in _REFUSED_FOR_NOW:
                    if run.workers > 1:
                        # (counted out at once: two workers refused at the same moment must
                        # not both leave, with the queue unanswered)
                        run.workers -= 1
                        run.crowded = True
                        raise _Crowded(failed.finding) from None
                    run.crowded = True
                    if self.slots.learn_cap(address):
                        # Sessions of this process (other groups', other jobs') fill the
                        # server: queue for the next of them to end, however long they last.
                        waits = iter(CROWDED_WAITS)
                        continue
                    # Not down: it gave this run a session before, or others' dials to it
                    # are under way (one of them got in; it counts as open once greeted).
                    alive = host.name in run.greeted or self.slots.busy(address)
                    wait = next(waits, None) if alive else None
                    if wait is not None:
                        await asyncio.sleep(wait)
                        continue
                failures.append(failed.finding)
                return None
            except BaseException:
                held.release()
                raise
            run.greeted.add(host.name)
            held.opened()
            return _Session(smtp, host, held)

    async def _connect(self, host: MailHost, address: str, stats: SmtpStats) -> aiosmtplib.SMTP:
        settings = self.settings
        smtp = aiosmtplib.SMTP(
            hostname=address,
            port=settings.smtp_port,
            local_hostname=settings.smtp_helo_name,
            timeout=settings.smtp_command_timeout,
            start_tls=False,
            validate_certs=False,
        )
        try:
            async with asyncio.timeout(settings.smtp_connect_timeout):
                stats.sessions += 1
                await _dial(smtp, settings.smtp_connect_timeout)
            try:
                await smtp.ehlo()
            except SMTPResponseException as refused:
                if refused.code < 500:  # 421/450 "try later": not a server without EHLO
                    raise
                await smtp.helo()
            if smtp.supports_extension("starttls"):
                # Like real MTAs we encrypt when offered but do not verify MX certificates,
                # and go on in plain text when the server then refuses (454: RFC 3207).
                try:
                    await smtp.starttls(server_hostname=host.name, validate_certs=False)
                except SMTPResponseException as refused:
                    if not 400 <= refused.code < 600:
                        raise
                else:
                    await smtp.ehlo()
            metrics.SMTP_SESSIONS_OPENED.inc()
            return smtp
        except SMTPConnectResponseError as exc:
            smtp.close()
            # A refusal in the banner (554 "no SMTP service here") comes before any address
            # is named: it refuses us, so blocked; a 4xx or 421 is a temporary failure.
            outcome = SmtpOutcome.BLOCKED if exc.code >= 500 else SmtpOutcome.TEMP_FAILURE
            raise _NoSession(Finding(outcome, one_line(exc.code, exc.message), host.name)) from exc
        except (TimeoutError, SMTPTimeoutError) as exc:
            smtp.close()
            raise _NoSession(
                Finding(SmtpOutcome.TIMEOUT, f"{host.name} did not answer in time", host.name)
            ) from exc
        except SMTPResponseException as exc:
            smtp.close()
            # EHLO (and HELO) refused: a 4xx (421, 450 "try again later") is a temporary
            # failure; a policy reason (554 5.7.1 Helo command rejected) is a block; anything
            # else is a server we cannot speak SMTP with.
            if 400 <= exc.code < 500:
                outcome = SmtpOutcome.TEMP_FAILURE
            elif classify_rcpt(exc.code, exc.message) is SmtpOutcome.BLOCKED:
                outcome = SmtpOutcome.BLOCKED
            else:
                outcome = SmtpOutcome.PROTOCOL_ERROR
            raise _NoSession(Finding(outcome, one_line(exc.code, exc.message), host.name)) from exc
        except (SMTPException, OSError) as exc:
            smtp.close()
            raise _NoSession(
                Finding(SmtpOutcome.CONNECTION_FAILED, f"{host.name}: {exc}", host.name)
            ) from exc
        except BaseException:  # cancelled mid-greeting (a run told to stop): hang up too
            smtp.close()
            raise


async def _dial(smtp: aiosmtplib.SMTP, timeout: float) -> None:
    """``smtp.connect``; if cancelled meanwhile (a run told to stop), wait for the connect to
    end and hang up: cancelling aiosmtplib's connect would leave the connection open. Once
    TCP is up (``smtp.transport`` is set before the greeting) the socket is aborted first,
    so a deadline is not held up by a server that never greets."""
    dialling = asyncio.ensure_future(smtp.connect(timeout=timeout))
    try:
        await asyncio.shield(dialling)
    except asyncio.CancelledError:
        if smtp.transport is not None:  # connected, waiting for the banner: hang up now,
            smtp.transport.abort()  # not when a silent server's greeting times out
        with contextlib.suppress(BaseException):
            await dialling
        smtp.close()
        raise


def _summarise(failures: list[Finding]) -> Finding:
    """One finding for "no host reachable", the most telling failure first."""
    if not failures:
        return Finding(SmtpOutcome.CONNECTION_FAILED, "no mail host could be reached")
    order = [
        SmtpOutcome.BLOCKED,
        SmtpOutcome.TEMP_FAILURE,
        SmtpOutcome.PROTOCOL_ERROR,
        SmtpOutcome.TIMEOUT,
        SmtpOutcome.CONNECTION_FAILED,
    ]
    for outcome in order:
        for finding in failures:
            if finding.outcome is outcome:
                return finding
    return failures[0]


@dataclass
class SequenceResult:
    """The finder's probe: catch-all first, then candidates until one is accepted."""

    catch_all: bool | None
    findings: dict[str, Finding]  # candidate -> finding, only those actually tried
    accepted: str | None  # the first candidate whose mailbox exists (accepted, or full)
    stats: SmtpStats
    failure: Finding | None = None  # not checked: no session, a block, or put off (4xx)


class DomainSession:
    """The finder's SMTP session to one domain, shared by every lookup made through it.

    A finder CSV job looks up many people at the same company: each person's candidates
    go over the same connection (one ``MAIL FROM``, more ``RCPT TO``), the random-address
    catch-all probe is sent once per domain, and a fresh session is opened before the
    server's recipient or rejection limit (Postfix hangs up after about 20 refused
    recipients), not after it. A single lookup is just a session used once.

    Lookups through one session run one after another (the flow awaits each row in turn);
    the session is not safe for concurrent ``probe`` calls.

    ``open_greylist``: for a job pass that a deferred retry pass follows. Greylisting
    (postgrey) passes a (client, sender, recipient) triplet only when it is asked again
    after its delay, so a recipient never asked before is greylisted on the retry too. With
    this, a greylisted answer does not end the lookup: the remaining candidates are asked
    once each (every one greylisted, or passed if it was seen before), and the lookup's
    answer is still the greylisting — so the retry pass finds the person's address among
    candidates the server already knows. Other 4xx answers and blocks end the lookup as
    always; the cap on candidates (``max_probes``) is the caller's, as always.
    """

    def __init__(self, prober: Prober, *, open_greylist: bool = False) -> None:
        self.prober = prober
        self.open_greylist = open_greylist
        self.domain: str | None = None
        self.catch_all: bool | None = None
        self._probed = False  # the catch-all probe got a clear answer
        self._run: _Run | None = None
        self._session: _Session | None = None
        self._failure: Finding | None = None  # no session could be had: same for every row

    async def __aenter__(self) -> DomainSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _bind(self, hosts: tuple[MailHost, ...], domain: str) -> _Run:
        if self._run is None:
            self.domain = domain
            group = HostGroup(hosts=hosts, domains={domain: []}, probe_catch_all=False)
            self._run = _Run(group, deque(), GroupResult())
        elif domain != self.domain:
            raise ValueError(f"this session is for {self.domain}, not {domain}")
        return self._run

    async def _ready(self, run: _Run) -> _Session:
        """The open session, or a fresh one when the last is closed or at a server limit."""
        session = self._session
        if session is not None and not session.closed and not self.prober._session_full(session):
            return session
        if session is not None:
            await session.close()
            self._session = None
        self._session = await self.prober._open(run)
        return self._session

    async def probe(
        self,
        hosts: tuple[MailHost, ...],
        domain: str,
        candidates: list[str],
        *,
        check_catch_all: bool = True,
    ) -> SequenceResult:
        """Try ``candidates`` in order; stop at the first whose mailbox exists (accepted,
        or full: "552 5.2.2" names a mailbox that is there).

        The catch-all probe goes first, once per session's domain; on a catch-all domain
        no candidate is sent at all, because there an accepted candidate proves nothing.
        A session that breaks is reopened at most once per call; a host that breaks
        ``MAX_ATTEMPTS`` sessions in a row is dropped as the engine drops it (the next MX
        host is tried, and with none left every later call gets the same failure).
        """
        run = self._bind(hosts, domain)
        run.result = GroupResult()  # this lookup's findings and traffic only
        stats = run.result.stats
        if self._failure is not None:
            return SequenceResult(None, {}, None, stats, failure=self._failure)
        items = [_Item(domain, c) for c in candidates]
        if check_catch_all and not self._probed:
            probe = probe_address(domain, self.prober.settings.smtp_mail_from)
            items.insert(0, _Item(domain, probe, is_probe=True))
        elif self._probed and self.catch_all:
            return SequenceResult(True, {}, None, stats)
        reopened = False
        accepted: str | None = None
        put_off: Finding | None = None  # (open_greylist: the first greylisted answer)
        index = 0
        while index < len(items):
            try:
                session = await self._ready(run)
            except _NoSession as failed:
                self._failure = failed.finding
                return SequenceResult(None, {}, None, stats, failure=failed.finding)
            item = items[index]
            try:
                code, message = await self.prober._rcpt(session, item, stats)
            except _SenderRefused as refused:  # the same for every candidate and row
                await session.close()
                self._failure = refused.finding
                return SequenceResult(None, {}, None, stats, failure=refused.finding)
            except _NotAsked as refused:  # nothing learnt of this candidate
                index += 1
                self.prober._record(run, item, refused.finding)
                continue
            except _AskAgain:  # (a full session: the candidate is asked in a fresh one)
                await session.close()
                continue
            except _SessionLost as lost:
                ended = lost.finding.outcome in _SERVER_ENDED
                await session.close(polite=False)
                if not (ended and self.prober._hung_up(session)):
                    self.prober._broken(run, session.host.name, lost.finding)
                if reopened:
                    self.prober._record(run, item, lost.finding)
                    break
                reopened = True
                continue
            if _too_many_recipients(code, message, session.rcpts - 1):
                # Too many recipients for one transaction: learn the limit, ask again anew.
                self.prober._learn_rcpt_limit(session)
                await session.close()
                continue
            finding = Finding(
                classify_rcpt(code, message), one_line(code, message), session.host.name
            )
            if code == 421:
                # The server is closing the session: this is no answer about the candidate,
                # which is asked again in a new session (as the bulk path retries it).
                await session.close(polite=False)
                if not run.result.findings and session.rejections <= 1:
                    # Before any candidate was answered, and after at most the catch-all
                    # probe's refusal (no error limit is that low): the server turns us away.
                    # Asking the other candidates would only be turned away too; this answer
                    # stands for them and for every later row.
                    self.prober._record(run, item, finding)
                    self._failure = finding
                    return SequenceResult(None, run.result.findings, None, stats, finding)
                if not self.prober._hung_up(session):
                    self.prober._broken(run, session.host.name, finding)
                item.attempts += 1
                stats.retries += 1
                if item.attempts < MAX_ATTEMPTS:
                    continue
                index += 1
                self.prober._record(run, item, finding)
                continue
            index += 1
            run.broken[session.host.name] = 0  # it answered
            _tally(session, finding.outcome)
            self.prober._record(run, item, finding)
            if self.open_greylist and finding.outcome is SmtpOutcome.GREYLISTED:
                put_off = put_off or finding  # (ask the rest: their triplets open now)
                continue
            if finding.outcome in _PUT_OFF or finding.outcome is SmtpOutcome.BLOCKED:
                # Greylisting or "try later" puts off every new recipient alike, and a policy
                # block (5.7.x) is about us, not the mailbox: asking the other candidates,
                # and every later row, would only hammer a server that said to wait or
                # refused us. They all get this answer.
                self._failure = finding
                findings = run.result.findings
                return SequenceResult(self.catch_all, findings, None, stats, failure=finding)
            if item.is_probe:
                self.catch_all = run.result.catch_all.get(domain)
                self._probed = self.catch_all is not None  # unclear: the next row asks again
                if self.catch_all:
                    break
            elif finding.outcome in _MAILBOX_EXISTS:
                accepted = item.rcpt
                break
        if put_off is not None:  # (an accepted candidate after it is unverified: retry it)
            return SequenceResult(None, run.result.findings, None, stats, failure=put_off)
        return SequenceResult(self.catch_all, run.result.findings, accepted, stats)
