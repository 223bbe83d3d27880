"""The finder's SMTP session to one domain: a person's candidates asked one after another
over one connection, shared by every lookup at that domain."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from verimail.engine.dns_facts import MailHost
from verimail.engine.smtp.findings import Finding, GroupResult, HostGroup, SmtpStats, probe_address
from verimail.engine.smtp.group_run import MAX_ATTEMPTS, GroupRun, Recipient
from verimail.engine.smtp.prober import Prober
from verimail.engine.smtp.replies import classify_rcpt, one_line
from verimail.engine.smtp.session import (
    SERVER_ENDED,
    AskAgain,
    NoSession,
    NotAsked,
    SenderRefused,
    Session,
    SessionLost,
    too_many_recipients,
)
from verimail.schemas.outcomes import SmtpOutcome

# RCPT TO answers that say the mailbox is there: the finder stops at the first.
_MAILBOX_EXISTS = (SmtpOutcome.ACCEPTED, SmtpOutcome.MAILBOX_FULL)
# A 4xx to RCPT TO (once retries are spent): the server puts us off for now.
_PUT_OFF = (SmtpOutcome.GREYLISTED, SmtpOutcome.TEMP_FAILURE)


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
        self._run: GroupRun | None = None
        self._session: Session | None = None
        self._failure: Finding | None = None  # no session could be had: same for every row

    async def __aenter__(self) -> DomainSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _bind(self, hosts: tuple[MailHost, ...], domain: str) -> GroupRun:
        if self._run is None:
            self.domain = domain
            group = HostGroup(hosts=hosts, domains={domain: []}, probe_catch_all=False)
            egress = self.prober.egress_for(hosts, domain)
            self._run = GroupRun(group, deque(), GroupResult(), egress=egress)
        elif domain != self.domain:
            raise ValueError(f"this session is for {self.domain}, not {domain}")
        return self._run

    async def _ready(self, run: GroupRun) -> Session:
        """The open session, or a fresh one when the last is closed or at a server limit."""
        session = self._session
        if session is not None and not session.closed and not self.prober.session_full(session):
            return session
        if session is not None:
            await session.close()
            self._session = None
        self._session = await self.prober.open_session(run)
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
        items = [Recipient(domain, c) for c in candidates]
        if check_catch_all and not self._probed:
            egress = run.egress or self.prober.egress_for(hosts, domain)
            probe = probe_address(domain, egress.sender(self.prober.settings))
            items.insert(0, Recipient(domain, probe, is_probe=True))
        elif self._probed and self.catch_all:
            return SequenceResult(True, {}, None, stats)
        reopened = False
        accepted: str | None = None
        put_off: Finding | None = None  # (open_greylist: the first greylisted answer)
        index = 0
        while index < len(items):
            try:
                session = await self._ready(run)
            except NoSession as failed:
                self._failure = failed.finding
                return SequenceResult(None, {}, None, stats, failure=failed.finding)
            item = items[index]
            try:
                code, message = await self.prober.rcpt(session, item, stats)
            except SenderRefused as refused:  # the same for every candidate and row
                await session.close()
                self._failure = refused.finding
                return SequenceResult(None, {}, None, stats, failure=refused.finding)
            except NotAsked as refused:  # nothing learnt of this candidate
                index += 1
                run.record(item, refused.finding)
                continue
            except AskAgain:  # (a full session: the candidate is asked in a fresh one)
                await session.close()
                continue
            except SessionLost as lost:
                ended = lost.finding.outcome in SERVER_ENDED
                await session.close(polite=False)
                if not (ended and self.prober.hung_up(session)):
                    run.session_broke(session.host.name, lost.finding)
                if reopened:
                    run.record(item, lost.finding)
                    break
                reopened = True
                continue
            if too_many_recipients(code, message, session.rcpts - 1):
                # Too many recipients for one transaction: learn the limit, ask again anew.
                self.prober.learn_rcpt_limit(session)
                await session.close()
                continue
            finding = Finding(
                classify_rcpt(code, message), one_line(code, message), session.host.name
            )
            if finding.outcome is SmtpOutcome.EGRESS_BLOCKED:  # (our IP: cool the egress down)
                address = session.smtp.hostname or ""
                finding = await self.prober.egress_refused(session.egress, address, finding)
            if code == 421:
                # The server is closing the session: this is no answer about the candidate,
                # which is asked again in a new session (as the bulk path retries it).
                await session.close(polite=False)
                if not run.result.findings and session.rejections <= 1:
                    # Before any candidate was answered, and after at most the catch-all
                    # probe's refusal (no error limit is that low): the server turns us away.
                    # Asking the other candidates would only be turned away too; this answer
                    # stands for them and for every later row.
                    run.record(item, finding)
                    self._failure = finding
                    return SequenceResult(None, run.result.findings, None, stats, finding)
                if not self.prober.hung_up(session):
                    run.session_broke(session.host.name, finding)
                item.attempts += 1
                stats.retries += 1
                if item.attempts < MAX_ATTEMPTS:
                    continue
                index += 1
                run.record(item, finding)
                continue
            index += 1
            run.broken[session.host.name] = 0  # it answered
            session.tally(finding.outcome)
            run.record(item, finding)
            if self.open_greylist and finding.outcome is SmtpOutcome.GREYLISTED:
                put_off = put_off or finding  # (ask the rest: their triplets open now)
                continue
            if finding.outcome in _PUT_OFF or finding.outcome in (
                SmtpOutcome.BLOCKED,
                SmtpOutcome.EGRESS_BLOCKED,
            ):
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
