"""The SMTP prober: many ``RCPT TO`` per session, grouped by mail host. Never ``DATA``.

Why one long file: a host group's run, the sessions it dials and what it learns of hosts
(limits, refusals of our egress) share the run's state; apart, each would reach into the other.

A *host group* is every domain whose MX hosts lead to the same servers (IP addresses), whatever
their names: a shared host that gives each customer domain an MX name of its own carries
them all in one group's sessions (``smtp_sessions_by_server``). For each group the prober
opens at most ``smtp_max_sessions_per_host`` sessions (and no more than the work needs;
the cap holds per server IP address across every group and MX name that reach it),
and each session walks a shared queue of recipients ordered by domain:

- ``MAIL FROM`` once per session: recipients of all the group's domains share one
  transaction (a server that refuses the mix gets ``RSET`` + ``MAIL FROM`` per domain);
- what is learnt of a server (its recipient and rejection limits, no mixing) is kept by
  its IP address, as its session slots are: every MX name that leads there shares it;
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
- a server that refuses our sending IP (a reply naming a blocklist, a 554 banner,
  :data:`~verimail.engine.smtp.session.GREETING_RESETS` resets before the greeting): the
  host is dropped for the run like one that refuses our sender, and the egress is cooled
  down for that server IP (:mod:`~verimail.engine.smtp.egress_cooldown`): sessions there
  through it are not even dialled meanwhile, the addresses end ``egress_blocked``;
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
import dataclasses
import math
from collections import deque

from verimail.config import Settings
from verimail.engine.dns_facts import MailHost
from verimail.engine.netguard import connect_allowed
from verimail.engine.smtp.egress import Egress, Routes
from verimail.engine.smtp.egress_cooldown import EgressCooldown, refused_ip, reset_out
from verimail.engine.smtp.findings import Finding, GroupResult, HostGroup, SmtpStats, probe_address
from verimail.engine.smtp.group_run import GroupRun, Recipient
from verimail.engine.smtp.host_slots import HostSlots
from verimail.engine.smtp.learned import LearnedLimits
from verimail.engine.smtp.replies import classify_rcpt, one_line, refuses_egress
from verimail.engine.smtp.session import (
    GREETING_RESETS,
    SERVER_ENDED,
    AskAgain,
    NoSession,
    NotAsked,
    ResetAtGreeting,
    SenderRefused,
    Session,
    SessionLost,
    connect,
    summarise,
    too_many_recipients,
)
from verimail.schemas.outcomes import SmtpOutcome

MAX_CONNECT_ATTEMPTS = 5  # addresses dialled to open one session, all MX hosts together


CROWDED_WAITS = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds the last worker of a run waits before dialling again a host that refused it for
now while no session of this process is there but it gave this run one before: a server's
count of connections may lag our QUIT, and other machines' sessions end. (While this
process has sessions there, the worker queues for their slots instead:
:meth:`~verimail.engine.smtp.host_slots.HostSlots.learn_cap`.)"""


# How a server at its limit of connections at once turns one more away: a 421 banner, or
# closing the connection before (or while) it sends one.
_REFUSED_FOR_NOW = (SmtpOutcome.TEMP_FAILURE, SmtpOutcome.CONNECTION_FAILED)


class _Crowded(NoSession):
    """A new session was refused for now (4xx) while the run has others open: no verdict."""


# Answers to a domain's first recipient in a mixed transaction that may be a refusal of
# the mix itself rather than of the recipient (greylisting and 452/421 are handled apart).
_MIX_SUSPECT = (SmtpOutcome.BLOCKED, SmtpOutcome.REJECTED_OTHER, SmtpOutcome.TEMP_FAILURE)


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
        # learnt of servers (by IP): recipient and rejection limits, no mixing
        self.learned = LearnedLimits(settings.redis_url)
        self.routes = Routes.from_settings(settings)
        self.cooldown = EgressCooldown(settings.smtp_egress_cooldown, settings.redis_url)

    def egress_for(self, hosts: tuple[MailHost, ...], domain: str) -> Egress:
        """The egress ``domain``'s sessions to ``hosts`` leave from (the same every pass)."""
        return self.routes.choose(tuple(h.name for h in hosts), domain)

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
        # A run per egress the group's domains leave through (one, unless routes spread them)
        parts = self.routes.split(tuple(h.name for h in group.hosts), group.domains, group.egresses)
        await asyncio.gather(
            *(
                self._run_part(group.part(domains), egress, result, greylist_retries)
                for egress, domains in parts.items()
            )
        )
        for domain in group.domains:
            result.catch_all.setdefault(domain, None)
        return result

    async def _run_part(
        self,
        group: HostGroup,
        egress: Egress,
        result: GroupResult,
        greylist_retries: int,
        tried: tuple[str, ...] = (),
    ) -> None:
        """Run ``group``'s recipients through ``egress``: its sessions, its sender, and the
        greylisting retries of this run from the same client address."""
        queue: deque[Recipient] = deque()
        for domain, rcpts in group.domains.items():
            if group.probe_catch_all:
                probe = probe_address(domain, egress.sender(self.settings))
                queue.append(Recipient(domain, probe, is_probe=True))
            queue.extend(Recipient(domain, rcpt) for rcpt in rcpts)
        run = GroupRun(group, queue, result, egress=egress)
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
        await self._next_route(group, egress, result, greylist_retries, (*tried, egress.name))

    async def _next_route(
        self,
        group: HostGroup,
        egress: Egress,
        result: GroupResult,
        greylist_retries: int,
        tried: tuple[str, ...],
    ) -> None:
        """The domains whose server refused ``egress``'s IP (egress_blocked) go out again
        through the next egress of their route not ``tried`` yet, where there is one; their
        findings are replaced by that run's. With one egress they stay egress_blocked."""
        hosts = tuple(h.name for h in group.hosts)
        parts: dict[Egress, dict[str, list[str]]] = {}
        for domain in refused_ip(group, result, egress.name):
            rcpts = group.domains[domain]
            following = [e for e in self.routes.ranked(hosts, domain) if e.name not in tried]
            if following:
                parts.setdefault(following[0], {})[domain] = rcpts
        await asyncio.gather(
            *(
                self._run_part(group.part(domains), nxt, result, greylist_retries, tried)
                for nxt, domains in parts.items()
            )
        )

    async def _drain(self, run: GroupRun) -> None:
        """Work the queue with as many sessions as it needs, up to the per-host cap: as
        many as full sessions would take to begin with, more as sessions end early
        (:meth:`_more_workers`)."""
        await self.learned.refresh(_servers(run.group))  # (other workers' lessons)
        limit = self._session_rcpt_limit(run.group)
        workers = max(1, min(self._cap(run), math.ceil(len(run.queue) / limit)))
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

    def _more_workers(self, run: GroupRun, session: Session) -> None:
        """A session ended before its claim was done (the rejection limit, a hang-up, a
        452): from now on claims are what this session got through, and more workers start
        if what is left needs more sessions than are at work. The first count assumed full
        sessions (a list of 300 mostly invalid addresses on one host ran on 3 sessions of
        the 5 allowed)."""
        per_session = run.per_session = max(1, session.rcpts)
        if run.spawn is None or run.crowded:
            return
        wanted = min(self._cap(run), math.ceil(len(run.queue) / per_session))
        while run.workers < wanted:
            run.spawn()

    def _egress(self, run: GroupRun) -> Egress:
        if run.egress is None:  # (a run made outside run_group: the finder's session)
            domain = next(iter(run.group.domains), "")
            run.egress = self.egress_for(run.group.hosts, domain)
        return run.egress

    def _cap(self, run: GroupRun) -> int:
        """Sessions at once per server for this run: its egress's cap."""
        return self._egress(run).session_cap(self.settings)

    def _session_rcpt_limit(self, group: HostGroup) -> int:
        limits = (self.learned.rcpt_limit(a) for a in _servers(group))
        learned = min((limit for limit in limits if limit is not None), default=10**9)
        return max(1, min(self.settings.smtp_rcpts_per_session, learned))

    def session_full(self, session: Session) -> bool:
        """The session reached the recipients or rejections a session may have on its host
        (the settings', or lower limits learnt of the server): the next goes in a fresh one."""
        server = session.address
        rcpt_limit = min(
            self.settings.smtp_rcpts_per_session, self.learned.rcpt_limit(server) or 10**9
        )
        rej_limit = min(
            self.settings.smtp_max_rejections_per_session,
            self.learned.rejection_limit(server) or 10**9,
        )
        return session.rcpts >= rcpt_limit or session.rejections >= rej_limit

    async def _worker(self, run: GroupRun) -> None:
        """Take a session's worth of recipients, then connect; repeat until none are left.

        Claiming before connecting means N workers open about ceil(recipients / limit)
        sessions rather than one each plus idle ones that found the queue empty.
        """
        session: Session | None = None
        counted = True  # (counted in by _drain, until _dial_host counts it out as it leaves)
        try:
            while run.queue:
                if session is not None and (session.closed or self.session_full(session)):
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
                        session = await self.open_session(run)
                    except _Crowded:  # the sessions already open carry on with the queue
                        counted = False
                        run.queue.extendleft(reversed(claimed))
                        return
                    except NoSession as failed:
                        for item in claimed + list(run.queue):
                            run.record(item, failed.finding)
                        run.queue.clear()
                        return
                for index, item in enumerate(claimed):
                    if session.closed or self.session_full(session):
                        run.put_back(claimed[index:], claimed[index - 1] if index else None)
                        self._more_workers(run, session)
                        break
                    await self._check(run, session, item)
        finally:
            if counted:
                run.workers -= 1
            if session is not None:
                await session.close()

    async def _check(self, run: GroupRun, session: Session, item: Recipient) -> None:
        stats = run.result.stats
        try:
            code, message = await self.rcpt(session, item, stats)
        except SenderRefused as refused:
            # This host will not take our sender: drop it for the run (the next MX host is
            # tried; with none left, every item gets this finding) and ask again elsewhere.
            await self._drop_host(run, session, item, refused.finding)
            return
        except NotAsked as refused:
            run.record(item, refused.finding)
            return
        except AskAgain:  # in a transaction of its own, in the next session
            run.queue.appendleft(item)
            return
        except SessionLost as lost:
            ended = lost.finding.outcome in SERVER_ENDED
            await self._cut_short(run, session, item, lost.finding, hung_up=ended)
            return
        host = session.host.name
        # (A 421 naming our IP, Gmail's "unusual rate … from your IP address", refuses the
        # egress: read below, like any other refusal of it.)
        if code == 421 and not refuses_egress(code, message):
            # Closing the session is no answer: it counts as a broken session, so a host that
            # only ever says 421 is dropped and the next MX host is asked (README: MX
            # fallback on refusal/timeout/421), as the finder's sessions already did. Unless
            # it hung up after rejections: that is its error limit, not a broken host.
            finding = Finding(SmtpOutcome.TEMP_FAILURE, one_line(code, message), host)
            await self._cut_short(run, session, item, finding, hung_up=True)
            return
        run.broken[host] = 0  # it answered: whatever broke before was not the host itself
        if too_many_recipients(code, message, session.rcpts - 1):
            # No answer about the recipient, and no try of it either: it goes first in the
            # next session, where as the first RCPT it cannot be "too many". (The session
            # answered others before, so the queue still shrinks.)
            self.learn_rcpt_limit(session)
            await session.close()
            run.queue.appendleft(item)
            return
        outcome = classify_rcpt(code, message)
        finding = Finding(outcome, one_line(code, message), host)
        if outcome is SmtpOutcome.EGRESS_BLOCKED:
            # It refuses our IP, not this recipient: every other one would get the same.
            await self._drop_host(run, session, item, finding)
            return
        session.tally(outcome)
        if outcome in (SmtpOutcome.GREYLISTED, SmtpOutcome.TEMP_FAILURE):
            run.retry_later.append(item)
        run.record(item, finding)

    async def _drop_host(
        self, run: GroupRun, session: Session, item: Recipient, finding: Finding
    ) -> None:
        """The host refused our sender or our sending IP, whoever the recipient: close, drop
        the host for the run (the next MX host is tried; with none left every item gets
        ``finding``), cool the egress down there when it refused our IP, and put ``item``
        back unanswered."""
        await session.close()
        if finding.outcome is SmtpOutcome.EGRESS_BLOCKED:
            address = session.smtp.hostname or ""
            finding = await self.egress_refused(session.egress, address, finding)
        host = session.host.name
        if host not in run.dead_hosts:
            run.dead_hosts.add(host)
            run.failures.append(finding)
        run.queue.appendleft(item)

    async def egress_refused(self, egress: Egress, address: str, finding: Finding) -> Finding:
        """``finding`` (egress_blocked) as ``egress``'s, which cools down for the server at
        ``address``."""
        finding = dataclasses.replace(finding, egress=egress.name)
        await self.cooldown.cool(egress.name, address, finding.response or "")
        return finding

    async def _cut_short(
        self, run: GroupRun, session: Session, item: Recipient, finding: Finding, *, hung_up: bool
    ) -> None:
        """The session ended under ``item`` (a 421, a dropped connection, a timeout): after
        a hang-up at the host's error limit the item goes back uncounted (see
        :meth:`hung_up`); otherwise the session counts as broken and the item is asked
        again (:meth:`GroupRun.ask_again`)."""
        await session.close(polite=False)
        if hung_up and self.hung_up(session):
            run.queue.appendleft(item)
            return
        run.session_broke(session.host.name, finding)
        run.ask_again(item, session.host.name, finding)

    def learn_rcpt_limit(self, session: Session) -> None:
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
        self.learned.lower_rcpt_limit(session.address, max(1, session.rcpts - 1))

    def hung_up(self, session: Session) -> bool:
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
        self.learned.lower_rejection_limit(session.address, max(1, session.rejections - 1))
        return True

    async def rcpt(self, session: Session, item: Recipient, stats: SmtpStats) -> tuple[int, str]:
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
            raise NotAsked(Finding(SmtpOutcome.NOT_ATTEMPTED, "", session.host.name))
        with session.commands():
            joins = session.in_tx and item.domain not in session.tx_domains
            if not session.in_tx or (joins and not self._mixes(session)):
                await session.mail_from(session.egress.sender(self.settings), stats)
                joins = False
            code, message = await session.rcpt_to(item, stats)
            suspect = code not in (421, 452) and classify_rcpt(code, message) in _MIX_SUSPECT
            if joins and suspect:
                self.learned.mark_one_domain(session.address)
                if self.session_full(session):  # (asking again here would pass the cap)
                    raise AskAgain(Finding(SmtpOutcome.NOT_ATTEMPTED, "", session.host.name))
                await session.mail_from(session.egress.sender(self.settings), stats)
                code, message = await session.rcpt_to(item, stats)
            return code, message

    def _mixes(self, session: Session) -> bool:
        return self.settings.smtp_mix_domains and not self.learned.one_domain(session.address)

    async def open_session(self, run: GroupRun) -> Session:
        """Connect to the best reachable MX host; raise ``NoSession`` when none answers.

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
                    raise NoSession(summarise(run.failures + failures))
                dialled += 1
                session = await self._dial_host(run, host, address, failures)
                if session is not None:
                    return session
            run.dead_hosts.add(host.name)
        raise NoSession(summarise(run.failures + failures))

    async def _dial_host(
        self, run: GroupRun, host: MailHost, address: str, failures: list[Finding]
    ) -> Session | None:
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
        egress = self._egress(run)
        cooling = await self.cooldown.cooling(egress.name, address)
        if cooling is not None:  # refused us a moment ago: not dialled again for now
            failures.append(
                Finding(SmtpOutcome.EGRESS_BLOCKED, cooling or None, host.name, egress.name)
            )
            return None
        waits = iter(CROWDED_WAITS)
        key, cap = egress.slot_key(address), egress.session_cap(self.settings)
        resets = 0
        while True:
            await self.learned.refresh([address])  # (what others learnt meanwhile)
            held = await self.slots.take(key, cap)  # (per server: names may share one)
            try:
                smtp = await connect(self.settings, host, address, run.result.stats, egress)
            except NoSession as failed:
                held.release()
                run.result.stats.connect_failures += 1
                if failed.finding.outcome is SmtpOutcome.EGRESS_BLOCKED:
                    refused = await self.egress_refused(egress, address, failed.finding)
                    failures.append(refused)
                    return None
                if failed.finding.outcome in _REFUSED_FOR_NOW:
                    if run.workers > 1:
                        # (counted out at once: two workers refused at the same moment must
                        # not both leave, with the queue unanswered)
                        run.workers -= 1
                        run.crowded = True
                        raise _Crowded(failed.finding) from None
                    run.crowded = True
                    if self.slots.learn_cap(key, cap):
                        # Sessions of this process (other groups', other jobs') fill the
                        # server: queue for the next of them to end, however long they last.
                        waits = iter(CROWDED_WAITS)
                        continue
                    # Not down: it gave this run a session before, or others' dials to it
                    # are under way (one of them got in; it counts as open once greeted).
                    alive = host.name in run.greeted or self.slots.busy(key, cap)
                    if not alive and isinstance(failed, ResetAtGreeting):
                        resets += 1
                        if resets < GREETING_RESETS:
                            continue  # (once is a server in trouble; again and again is us)
                        refused = reset_out(host.name)
                        failures.append(await self.egress_refused(egress, address, refused))
                        return None
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
            return Session(smtp, host, held, egress, address)


def _servers(group: HostGroup) -> list[str]:
    """The server addresses of ``group``'s hosts: what lessons are kept by."""
    return [address for host in group.hosts for address in host.addresses]
