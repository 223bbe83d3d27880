"""One SMTP session with a mail host: connecting to it (EHLO, STARTTLS), its transaction
(``MAIL FROM``, ``RCPT TO``), and the ways work on a recipient stops short of an answer (a
lost session, a recipient not asked, no session to be had)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiosmtplib
from aiosmtplib.errors import (
    SMTPConnectError,
    SMTPConnectResponseError,
    SMTPException,
    SMTPResponseException,
    SMTPServerDisconnected,
    SMTPTimeoutError,
)

from verimail.config import Settings
from verimail.engine import metrics
from verimail.engine.dns_facts import MailHost
from verimail.engine.smtp.egress import Egress, open_socket
from verimail.engine.smtp.egress_kinds.failed import EgressFailed
from verimail.engine.smtp.findings import Finding, SmtpStats
from verimail.engine.smtp.group_run import Recipient
from verimail.engine.smtp.host_slots import HeldSlots
from verimail.engine.smtp.replies import (
    asks_new_session,
    classify_rcpt,
    one_line,
    refuses_egress,
)
from verimail.schemas.outcomes import SmtpOutcome


class Stopped(Exception):
    """Work on a recipient stopped with ``finding`` (what the subclasses say happened)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.response)
        self.finding = finding


class SessionLost(Stopped):
    """The session broke mid-way (421, disconnect, timeout): retry elsewhere."""


class NotAsked(Stopped):
    """The recipient was not asked about: the server refused our ``MAIL FROM``, or cannot
    take the address at all (a non-ASCII local part without SMTPUTF8). Nothing was learnt
    of the mailbox, and the session is not charged a rejection."""


class SenderRefused(NotAsked):
    """The host refused our ``MAIL FROM``: it will refuse it for every recipient, so the
    host is done for this run (each further recipient would cost one more refused command,
    and Postfix hangs up after 20 errors)."""


def _sender_refused(code: int, message: str, host: str) -> SenderRefused:
    """A refused sender is never "no such mailbox" (a 5.1.x there is about *our* address):
    5xx reads as blocked, 4xx as a temporary failure — both unknown — and a refusal naming
    a blocklist or our IP as egress_blocked."""
    outcome = SmtpOutcome.BLOCKED if code >= 500 else SmtpOutcome.TEMP_FAILURE
    if refuses_egress(code, message):
        outcome = SmtpOutcome.EGRESS_BLOCKED
    return SenderRefused(Finding(outcome, one_line(code, message), host))


def too_many_recipients(code: int, message: str, earlier: int) -> bool:
    """A 452 that asks for a new session: ``earlier`` recipients of this session were
    answered, and it says so (:func:`~verimail.engine.smtp.replies.asks_new_session`).
    Never on a session's first recipient (a limit of none cannot be learnt: that is a
    temporary failure, retried within bounds)."""
    return earlier > 0 and asks_new_session(code, message)


class AskAgain(Stopped):
    """The recipient must be asked again, in a later session (it was not answered here)."""


class NoSession(Stopped):
    """No MX host of the group could be reached: the finding applies to all its work."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding)
        metrics.SMTP_SESSIONS_REFUSED.labels(reason=finding.outcome.value).inc()


class ResetAtGreeting(NoSession):
    """The server took the connection and dropped it before any greeting: once is a server
    in trouble, several times in a row is a server turning our IP away
    (:data:`GREETING_RESETS`, :meth:`Prober._dial_host`)."""


GREETING_RESETS = 3
"""Resets before the greeting, in a row and with no greeting between, that read as a
refusal of our sending IP (egress_blocked) rather than a broken server."""


# How a session ends at a server's error limit after rejections: it hangs up, or it
# tarpits (every reply after a rejection slower than our command timeout). See
# Prober.hung_up.
SERVER_ENDED = (SmtpOutcome.CONNECTION_FAILED, SmtpOutcome.TIMEOUT)


class Session:
    """One SMTP connection and the transaction state the prober needs."""

    def __init__(
        self,
        smtp: aiosmtplib.SMTP,
        host: MailHost,
        slots: HeldSlots,
        egress: Egress,
        address: str,
    ) -> None:
        self.smtp = smtp
        self.host = host
        self.address = address  # the server's IP: what its limits are learnt under
        self.egress = egress  # where the session left from (its HELO name, its sender)
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

    def tally(self, outcome: SmtpOutcome) -> None:
        """Count an answered recipient against the session's limits: a refused one against
        the rejections a server tolerates (every RCPT counts against the recipient cap as
        it is sent)."""
        if outcome is not SmtpOutcome.ACCEPTED:
            self.rejections += 1

    async def mail_from(self, sender: str, stats: SmtpStats) -> None:
        """Open a fresh transaction (``RSET`` first if one is open); :class:`SenderRefused`
        when the host refuses ``sender``."""
        smtp = self.smtp
        if self.in_tx:
            await smtp.execute_command(b"RSET")
            self.in_tx = False
        self.tx_domains.clear()
        args = [b"FROM:<" + sender.encode() + b">"]
        if self.smtputf8:
            args.append(b"SMTPUTF8")
        stats.mail_from += 1
        reply = self._in_range(await smtp.execute_command(b"MAIL", *args))
        if reply.code == 421:
            closing = one_line(reply.code, reply.message)
            raise SessionLost(Finding(SmtpOutcome.TEMP_FAILURE, closing, self.host.name))
        if not 200 <= reply.code < 300:
            raise _sender_refused(reply.code, reply.message, self.host.name)
        self.in_tx = True

    async def rcpt_to(self, item: Recipient, stats: SmtpStats) -> tuple[int, str]:
        """Send ``RCPT TO`` for ``item`` in the open transaction; the reply's code and text."""
        self.tx_domains.add(item.domain)
        stats.rcpts += 1
        self.rcpts += 1
        if item.is_probe:
            stats.catch_all_probes += 1
        reply = await self.smtp.execute_command(b"RCPT", b"TO:<" + item.rcpt.encode() + b">")
        reply = self._in_range(reply)
        return reply.code, reply.message

    @contextlib.contextmanager
    def commands(self) -> Iterator[None]:
        """Wraps the session's commands: one that times out, gets a reply aiosmtplib cannot
        read or loses the connection ends the session (:class:`SessionLost`), so the
        recipient is asked again rather than answered."""
        try:
            yield
        except Stopped:
            raise
        except SMTPTimeoutError as exc:
            raise SessionLost(
                Finding(
                    SmtpOutcome.TIMEOUT, f"timed out waiting for the server: {exc}", self.host.name
                )
            ) from exc
        except SMTPResponseException as exc:
            raise SessionLost(
                Finding(SmtpOutcome.PROTOCOL_ERROR, one_line(exc.code, exc.message), self.host.name)
            ) from exc
        except (SMTPException, OSError) as exc:
            raise SessionLost(
                Finding(SmtpOutcome.CONNECTION_FAILED, f"connection lost: {exc}", self.host.name)
            ) from exc

    def _in_range(self, reply: aiosmtplib.SMTPResponse) -> aiosmtplib.SMTPResponse:
        """``reply``, unless its code is outside 2xx-5xx (``999``): that is no answer, just
        as a code that is no number is none (aiosmtplib raises on those). Both break the
        session, so the recipient is asked again and a host that keeps doing it is dropped
        for the next MX host, rather than its nonsense being recorded as every recipient's
        answer."""
        if 200 <= reply.code < 600:
            return reply
        raise SessionLost(
            Finding(SmtpOutcome.PROTOCOL_ERROR, one_line(reply.code, reply.message), self.host.name)
        )


async def connect(
    settings: Settings, host: MailHost, address: str, stats: SmtpStats, egress: Egress
) -> aiosmtplib.SMTP:
    """A greeted connection to ``host`` at ``address`` through ``egress`` (EHLO, or HELO,
    and STARTTLS when offered); :class:`NoSession` with what went wrong. This is the one
    place sessions are dialled: through a proxy, the socket comes from
    :func:`~verimail.engine.smtp.egress.open_socket` and aiosmtplib speaks over it."""
    smtp = aiosmtplib.SMTP(
        local_hostname=egress.helo_name,
        timeout=settings.smtp_command_timeout,
        start_tls=False,
        validate_certs=False,
    )
    try:
        async with asyncio.timeout(settings.smtp_connect_timeout):
            stats.sessions += 1
            sock = await open_socket(
                egress, address, settings.smtp_port, settings.smtp_connect_timeout
            )
            where: dict[str, Any] = {"sock": sock}
            if sock is None:
                where = {"hostname": address, "port": settings.smtp_port}
            await _dial(smtp, settings.smtp_connect_timeout, where)
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
    except EgressFailed as exc:
        smtp.close()
        # Our way out failed, not the server: a sub-status of its own, never "invalid".
        raise NoSession(Finding(SmtpOutcome.EGRESS_FAILED, exc.reason, host.name)) from exc
    except SMTPConnectResponseError as exc:
        smtp.close()
        # A refusal in the banner (554 "no SMTP service here", postscreen's "blocked using")
        # comes before anything is said but our IP: it refuses our egress. A 4xx or 421 is
        # a temporary failure ("too many connections"), unless it names a blocklist.
        if exc.code >= 500 or refuses_egress(exc.code, exc.message):
            outcome = SmtpOutcome.EGRESS_BLOCKED
        else:
            outcome = SmtpOutcome.TEMP_FAILURE
        raise NoSession(Finding(outcome, one_line(exc.code, exc.message), host.name)) from exc
    except (TimeoutError, SMTPTimeoutError) as exc:
        smtp.close()
        # (Through a proxy this is a server, or the proxy, that did not answer: a proxy
        # waits for the server before it replies, so the two cannot be told apart, and a
        # firewalled MX is by far the more common.)
        late = f"{host.name}{_via(egress)} did not answer in time"
        raise NoSession(Finding(SmtpOutcome.TIMEOUT, late, host.name)) from exc
    except SMTPResponseException as exc:
        smtp.close()
        # EHLO (and HELO) refused: a 4xx (421, 450 "try again later") is a temporary
        # failure; a policy reason (554 5.7.1 Helo command rejected) is a block; anything
        # else is a server we cannot speak SMTP with.
        read = classify_rcpt(exc.code, exc.message)
        if read is SmtpOutcome.EGRESS_BLOCKED:
            outcome = read
        elif 400 <= exc.code < 500:
            outcome = SmtpOutcome.TEMP_FAILURE
        elif read is SmtpOutcome.BLOCKED:
            outcome = SmtpOutcome.BLOCKED
        else:
            outcome = SmtpOutcome.PROTOCOL_ERROR
        raise NoSession(Finding(outcome, one_line(exc.code, exc.message), host.name)) from exc
    except (SMTPException, OSError) as exc:
        smtp.close()
        # TCP was up, and the server hung up before its banner (aiosmtplib's "disconnected"
        # while reading it; a reset that beats the client's connect shows as ECONNRESET
        # there, where a port with nothing behind it answers ECONNREFUSED)
        # Through a proxy, a hang-up before the banner may be the proxy refusing the
        # destination (pproxy accepts the request, then closes): not counted against our IP.
        reset = (
            egress.proxy_url is None
            and isinstance(exc, SMTPConnectError)
            and isinstance(exc.__cause__, SMTPServerDisconnected | ConnectionResetError)
        )
        failed = ResetAtGreeting if reset else NoSession
        raise failed(
            Finding(SmtpOutcome.CONNECTION_FAILED, f"{host.name}{_via(egress)}: {exc}", host.name)
        ) from exc
    except BaseException:  # cancelled mid-greeting (a run told to stop): hang up too
        smtp.close()
        raise


def _via(egress: Egress) -> str:
    """Words naming a proxied egress in a failure (nothing for direct sessions)."""
    return "" if egress.proxy_url is None else f" (through egress {egress.name})"


async def _dial(smtp: aiosmtplib.SMTP, timeout: float, where: dict[str, Any]) -> None:
    """``smtp.connect``; if cancelled meanwhile (a run told to stop), wait for the connect to
    end and hang up: cancelling aiosmtplib's connect would leave the connection open. Once
    TCP is up (``smtp.transport`` is set before the greeting) the socket is aborted first,
    so a deadline is not held up by a server that never greets."""
    dialling = asyncio.ensure_future(smtp.connect(timeout=timeout, **where))
    try:
        await asyncio.shield(dialling)
    except asyncio.CancelledError:
        if smtp.transport is not None:  # connected, waiting for the banner: hang up now,
            smtp.transport.abort()  # not when a silent server's greeting times out
        with contextlib.suppress(BaseException):
            await dialling
        smtp.close()
        raise


def summarise(failures: list[Finding]) -> Finding:
    """One finding for "no host reachable", the most telling failure first."""
    if not failures:
        return Finding(SmtpOutcome.CONNECTION_FAILED, "no mail host could be reached")
    order = [
        SmtpOutcome.EGRESS_FAILED,  # (ours to fix: said first, whatever the servers did)
        SmtpOutcome.EGRESS_BLOCKED,
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
