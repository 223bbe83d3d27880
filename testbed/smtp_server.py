"""Scripted SMTP servers (aiosmtpd) for the testbed: one per host, each on its own 127.x.y.z.

Why one long file: every scripted behaviour is a branch of the same session handler; apart,
each would reach into the handler's state.

The reply texts follow Postfix, because that is what the prober meets most on the internet:

- banner: ``220 <host> ESMTP verimail testbed``; past ``max_connections`` open at once:
  ``421 4.7.0 Too many concurrent connections from your IP``, then close; with ``greeting_421``:
  ``421 4.3.2 Service not available``, then close; with ``greeting_reply``: that, then close
- ``EHLO`` / ``HELO``: the usual, or ``helo_reply`` when set
- ``STARTTLS`` (with ``starttls``): the handshake, or ``starttls_reply`` when set
- ``MAIL FROM``: ``250 2.1.0 Ok``, or ``mail_from_reply`` when set
- a client in ``blocklisted_clients`` at ``blocklist_stage`` ``greeting``: a banner
  ``554 5.7.1 … Client host [<ip>] blocked using zen.spamhaus.org`` (or ``blocklist_reply``,
  a provider's text), then close
- ``RCPT TO``, first rule that applies:
  a client in ``blocklisted_clients`` (``blocklist_stage`` ``rcpt``): the same 554 text;
  more than ``max_rcpts_per_session`` in this connection: ``452 4.5.3 Too many recipients``
  (or ``too_many_reply``);
  a scripted reply for the recipient (``rcpt_replies``);
  ``block``: ``554 5.7.1 Client host rejected: listed at a block list``;
  first ``greylist_tries`` tries of a (sender, recipient) pair, or (with ``greylist_delay``,
  postgrey's rule) a (client IP, sender, recipient) triplet first seen less than
  ``greylist_delay`` seconds ago: ``450 4.2.0 Greylisted, try again later``;
  in ``full_mailboxes``: ``552 5.2.2 Mailbox full`` (or ``full_reply``);
  in ``mailboxes`` or ``accept_all``: ``250 2.1.5 Ok``;
  else ``unknown_reply`` (``{addr}``: the recipient), or ``550 5.1.1 <addr>: Recipient
  address rejected: User unknown``
- the Nth rejection with N = ``disconnect_after_rejections``: the rejection, then at once
  ``421 4.7.0 <host> Error: too many errors`` and close (Postfix at its hard error limit)
- ``DATA``: ``554 5.5.1 DATA not allowed on the testbed`` (counted)

A host with ``hostile`` set breaks the protocol instead (``world.HOSTILE_MODES``): a silent
server, a garbage, huge, endless or never-ending multi-line banner, RCPT replies with invalid
codes, silence after EHLO, a TCP reset on ``RCPT TO`` or before the banner. Streaming modes
send at most ``hostile_bytes``, then hold the connection open without a word, so a broken client
cannot make the testbed spin for ever; sessions are counted like any other.

A *rejection* is any 450/550/552/554 reply to ``RCPT TO`` (Postfix counts 4xx and 5xx alike);
the 452 recipient-limit reply is not one. Once a session has ``tarpit_after_rejections``
rejections (1 by default) every reply waits ``tarpit_delay`` more, on top of ``reply_delay``;
the banner waits ``greeting_delay`` more.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from verimail.testbed.stats import StatsRegistry
from verimail.testbed.world import HostBehaviour, HostSpec

IDENT = "ESMTP verimail testbed"

REPLY_GREETING_421 = "421 4.3.2 Service not available"
REPLY_TOO_MANY_CONNECTIONS = "421 4.7.0 Too many concurrent connections from your IP"
REPLY_MAIL_OK = "250 2.1.0 Ok"
REPLY_RCPT_OK = "250 2.1.5 Ok"
REPLY_TOO_MANY = "452 4.5.3 Too many recipients"
REPLY_BLOCKED = "554 5.7.1 Client host rejected: listed at a block list"
REPLY_BLOCKLISTED = (
    "554 5.7.1 Service unavailable; Client host [{ip}] blocked using zen.spamhaus.org; "
    "https://www.spamhaus.org/query/ip/{ip}"
)
REPLY_GREYLISTED = "450 4.2.0 Greylisted, try again later"
REPLY_FULL = "552 5.2.2 Mailbox full"
REPLY_UNKNOWN = "550 5.1.1 <{addr}>: Recipient address rejected: User unknown"
REPLY_DATA = "554 5.5.1 DATA not allowed on the testbed"
REPLY_TOO_MANY_ERRORS = "421 4.7.0 {host} Error: too many errors"
REPLY_RCPT_999 = "999 5.1.1 Recipient status is a mystery"
REPLY_RCPT_GARBAGE = "2x5 this is not a reply code"
REPLY_OTHER_DOMAIN = "550 5.7.1 <{addr}>: recipients of one domain per message only"
BANNER_GARBAGE = b"XYZ this is not an SMTP server\r\n"
RAW_HOSTILE = {"silent", "garbage_banner", "huge_banner", "endless_line", "endless_multiline"}
_STREAM_CHUNK = 64 * 1024


class HostRuntime:
    """Everything a host's sessions share: its current spec, greylist memory and open sessions.

    The spec is read at every command, so ``Testbed.replace_world`` changes the behaviour of
    sessions that are already open too (as a reconfigured MTA would after a reload).
    """

    def __init__(
        self,
        spec: HostSpec,
        address: str,
        stats: StatsRegistry,
        tls_context: ssl.SSLContext | None,
    ) -> None:
        self.spec = spec
        self.address = address
        self.stats = stats
        self.tls_context = tls_context
        self.greylist: Counter[tuple[str, str]] = Counter()
        # postgrey's memory: triplet -> when first tried (monotonic), and the triplets passed
        self.triplets_seen: dict[tuple[str, str, str], float] = {}
        self.triplets_passed: set[tuple[str, str, str]] = set()
        self.sessions: set[TestbedSMTP] = set()
        self.server: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def behaviour(self) -> HostBehaviour:
        return self.spec.behaviour

    def decide_rcpt(self, session: TestbedSMTP, sender: str, address: str) -> str:
        """The reply to one ``RCPT TO``; updates greylist memory and the session's counters."""
        b = self.behaviour
        client = _client_ip(session)
        if b.blocklists(client, "rcpt"):
            return blocklisted(b, client)
        if (
            b.max_rcpts_per_session is not None
            and session.rcpts_answered >= b.max_rcpts_per_session
        ):
            return b.too_many_reply or REPLY_TOO_MANY
        session.rcpts_answered += 1
        scripted = b.scripted_reply(address)
        if scripted is not None:
            return scripted
        domain = address.rpartition("@")[2].lower()
        if session.tx_domain is None:
            session.tx_domain = domain
        elif b.one_domain_per_transaction and domain != session.tx_domain:
            return REPLY_OTHER_DOMAIN.format(addr=address)
        if b.hostile == "rcpt_code_999":
            return REPLY_RCPT_999
        if b.hostile == "rcpt_code_garbage":
            return REPLY_RCPT_GARBAGE
        if b.block:
            return REPLY_BLOCKED
        key = (sender.lower(), address.lower())
        if self.greylist[key] < b.greylist_tries:
            self.greylist[key] += 1
            return REPLY_GREYLISTED
        if b.greylist_delay is not None and self._postgrey_defers(session, key):
            return REPLY_GREYLISTED
        if b.is_full(address):
            return b.full_reply or REPLY_FULL
        if b.accept_all or b.has_mailbox(address):
            return REPLY_RCPT_OK
        if b.unknown_reply:
            return b.unknown_reply.replace("{addr}", address)
        return REPLY_UNKNOWN.format(addr=address)

    def _postgrey_defers(self, session: TestbedSMTP, pair: tuple[str, str]) -> bool:
        """postgrey's rule for the (client IP, sender, recipient) triplet: deferred until
        ``greylist_delay`` seconds after its first try, passed by a retry within
        ``greylist_window`` of it (and for good), new again when retried after the window."""
        b = self.behaviour
        peer = session.session.peer if session.session is not None else None
        triplet = (str(peer[0]) if peer else "", *pair)
        if triplet in self.triplets_passed:
            return False
        now = time.monotonic()
        first = self.triplets_seen.get(triplet)
        if first is None or now - first > b.greylist_window:
            self.triplets_seen[triplet] = now
            return True
        if now - first < (b.greylist_delay or 0.0):
            return True
        del self.triplets_seen[triplet]
        self.triplets_passed.add(triplet)
        return False

    async def start(self, sock: Any) -> None:
        """Serve on an already bound listening socket (the testbed picks the address)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: TestbedSMTP(self, loop), sock=sock)

    async def stop(self) -> None:
        """Stop listening and drop every open session (a tarpit must not outlive the testbed)."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.abort()
        if server is not None:
            await server.wait_closed()


class _Handler:
    """aiosmtpd hooks; per-session state lives on the ``TestbedSMTP`` instance."""

    def __init__(self, runtime: HostRuntime) -> None:
        self.runtime = runtime

    async def handle_EHLO(
        self,
        server: TestbedSMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        session.host_name = hostname
        # AUTH would always fail here: a verifier never logs in, so do not advertise it.
        responses = [r for r in responses if not r[4:].startswith("AUTH")]
        if self.runtime.behaviour.pipelining:
            responses.insert(len(responses) - 1, "250-PIPELINING")
        return responses

    async def handle_MAIL(
        self,
        server: TestbedSMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        self.runtime.stats.count(self.runtime.name, "mail_from")
        if self.runtime.behaviour.mail_from_reply:
            return self.runtime.behaviour.mail_from_reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return REPLY_MAIL_OK

    async def handle_RCPT(
        self,
        server: TestbedSMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        self.runtime.stats.rcpt(self.runtime.name, address)
        reply = self.runtime.decide_rcpt(server, envelope.mail_from or "", address)
        if reply[:3] in ("450", "550", "552", "554"):
            server.pending_rejection = True
        elif reply.startswith("250"):
            envelope.rcpt_tos.append(address)
        return reply


class TestbedSMTP(SMTP):
    """aiosmtpd's protocol with delays, the 421 greeting, DATA refusal and session counting."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, runtime: HostRuntime, loop: asyncio.AbstractEventLoop) -> None:
        behaviour = runtime.behaviour
        super().__init__(
            _Handler(runtime),
            hostname=runtime.name,
            ident=IDENT,
            enable_SMTPUTF8=behaviour.smtputf8,
            tls_context=runtime.tls_context if behaviour.starttls else None,
            timeout=300,
            loop=loop,
        )
        self.runtime = runtime
        self.rcpts_answered = 0
        self.tx_domain: str | None = None  # the current transaction's first recipient's
        self.rejections = 0
        self.pending_rejection = False
        self._in_multiline = False
        self._banner_sent = False  # (greeting_delay: before the first reply only)
        self._tb_opened = False
        self._tb_closed = False
        self._over_cap = False  # refused with REPLY_TOO_MANY_CONNECTIONS (max_connections)

    # ------------------------------------------------------------------ connection bookkeeping
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first = self._original_transport is None and not self._tb_opened
        super().connection_made(transport)
        if first:
            self._tb_opened = True
            # Counted here, in the order connections arrive, as a server's accept loop does:
            # deciding later, in _handle_client, let a burst of connections all see each
            # other and all be turned away.
            cap = self.runtime.behaviour.max_connections
            if cap is not None:
                admitted = sum(1 for other in self.runtime.sessions if not other._over_cap)
                self._over_cap = admitted >= cap
            self.runtime.sessions.add(self)
            self.runtime.stats.session_opened(self.runtime.name)

    def connection_lost(self, error: Exception | None) -> None:
        if self._tb_opened and not self._tb_closed:
            self._tb_closed = True
            self.runtime.sessions.discard(self)
            self.runtime.stats.session_closed(self.runtime.name)
        super().connection_lost(error)

    def eof_received(self) -> bool | None:
        """The client hung up: close our side at once, as an MTA does when it reads EOF.
        aiosmtpd kept the half-closed connection (and its session counted ``active``) until
        its next write — a slow greeting's 30 s — so a client's hang-up did not show."""
        super().eof_received()
        return False  # (False: asyncio closes the transport, and connection_lost counts it)

    # ------------------------------------------------------------------ replies
    async def push(self, status: Any) -> None:
        """Wait before the first line of every reply: ``reply_delay`` plus any tarpit."""
        text = status.decode("ascii", "replace") if isinstance(status, bytes) else status
        if not self._in_multiline:
            behaviour = self.runtime.behaviour
            tarpit = self.rejections >= max(1, behaviour.tarpit_after_rejections)
            delay = behaviour.reply_delay + (behaviour.tarpit_delay if tarpit else 0.0)
            if not self._banner_sent:
                self._banner_sent = True
                delay += behaviour.greeting_delay
            if delay > 0:
                await asyncio.sleep(delay)
        self._in_multiline = text[3:4] == "-"
        await super().push(status)

    async def _handle_client(self) -> None:
        behaviour = self.runtime.behaviour
        refusal = behaviour.greeting_reply
        client = _client_ip(self)
        if behaviour.blocklists(client, "greeting"):
            refusal = blocklisted(behaviour, client)
        if behaviour.hostile == "reset_at_greeting":
            self._abort()
            return
        if self._over_cap:
            refusal = REPLY_TOO_MANY_CONNECTIONS
        if behaviour.greeting_421 or refusal:
            await self.push(refusal or REPLY_GREETING_421)
            if self.transport is not None:
                self.transport.close()
            return
        if self.runtime.behaviour.hostile in RAW_HOSTILE:
            try:
                with contextlib.suppress(ConnectionError, OSError):
                    await self._misbehave(self.runtime.behaviour)
            finally:  # the client hung up (EOF cancels us): close our side as well
                if self.transport is not None:
                    self.transport.close()
            return
        await super()._handle_client()

    async def _misbehave(self, behaviour: HostBehaviour) -> None:
        """Play a protocol-breaking banner, then hold the connection without a word.

        The task is cancelled when the client hangs up (``connection_lost``), so holding
        costs nothing; aiosmtpd's idle timeout closes it at the latest.
        """
        mode = behaviour.hostile
        writer = self._writer
        budget = behaviour.hostile_bytes
        if mode == "garbage_banner":
            writer.write(BANNER_GARBAGE)
        elif mode in ("huge_banner", "endless_line"):
            writer.write(b"220 ")
            while budget > 0:
                chunk = min(budget, _STREAM_CHUNK)
                writer.write(b"x" * chunk)
                budget -= chunk
                await writer.drain()
            if mode == "huge_banner":
                writer.write(b"\r\n")
        elif mode == "endless_multiline":
            line = f"220-{self.runtime.name} still greeting you\r\n".encode()
            # Paced: a line per interval. Unpaced: 64 KB of lines per write, as fast as the
            # client reads (line by line, the testbed would be the bottleneck).
            block = line if behaviour.hostile_interval > 0 else line * (_STREAM_CHUNK // len(line))
            while budget > 0:
                writer.write(block)
                budget -= len(block)
                await writer.drain()
                if behaviour.hostile_interval > 0:
                    await asyncio.sleep(behaviour.hostile_interval)
        await writer.drain()
        await asyncio.get_running_loop().create_future()  # silent from here on

    # ------------------------------------------------------------------ commands
    async def smtp_EHLO(self, hostname: str) -> None:
        if self.runtime.behaviour.helo_reply:
            await self.push(self.runtime.behaviour.helo_reply)
            return
        await super().smtp_EHLO(hostname)

    async def smtp_HELO(self, hostname: str) -> None:
        if self.runtime.behaviour.helo_reply:
            await self.push(self.runtime.behaviour.helo_reply)
            return
        await super().smtp_HELO(hostname)

    async def smtp_RSET(self, arg: str | None) -> None:
        self.tx_domain = None
        await super().smtp_RSET(arg)

    async def smtp_MAIL(self, arg: str | None) -> None:
        self.tx_domain = None
        if self.runtime.behaviour.hostile == "mute_after_ehlo":
            try:
                await asyncio.get_running_loop().create_future()  # until the client hangs up
            finally:
                if self.transport is not None:
                    self.transport.close()
        await super().smtp_MAIL(arg)

    async def smtp_RCPT(self, arg: str | None) -> None:
        if self.runtime.behaviour.hostile == "reset_mid_rcpt":
            await self._reset(arg or "")
            return
        self.pending_rejection = False
        await super().smtp_RCPT(arg)
        if not self.pending_rejection:
            return
        self.pending_rejection = False
        self.rejections += 1
        self.runtime.stats.count(self.runtime.name, "rejections")
        self.runtime.stats.session_rejections(self.runtime.name, self.rejections)
        limit = self.runtime.behaviour.disconnect_after_rejections
        if limit is not None and self.rejections >= limit:
            self.runtime.stats.count(self.runtime.name, "hangups")
            await self.push(REPLY_TOO_MANY_ERRORS.format(host=self.runtime.name))
            # Stop reading at once, so that commands already in flight are neither answered
            # nor counted: cancel this very task and yield, so the cancellation lands here
            # rather than after the next (already buffered) command line was handled.
            if self.transport is not None:
                self.transport.close()
            if self._handler_coroutine is not None:
                self._handler_coroutine.cancel()
                await asyncio.sleep(0)

    def _abort(self) -> None:
        """A TCP RST (SO_LINGER 0) rather than a FIN."""
        transport = self.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()

    async def _reset(self, arg: str) -> None:
        """Drop the connection with a TCP RST (SO_LINGER 0), as a crashing MTA would."""
        self.runtime.stats.rcpt(self.runtime.name, arg)  # counted: the RCPT did arrive
        self._abort()
        if self._handler_coroutine is not None:
            self._handler_coroutine.cancel()
            await asyncio.sleep(0)

    async def smtp_DATA(self, arg: str) -> None:
        """Never accept a message: the testbed verifies, it must not be a mail sink."""
        self.runtime.stats.count(self.runtime.name, "data")
        await self.push(REPLY_DATA)

    async def smtp_STARTTLS(self, arg: str) -> None:
        if not arg and self.tls_context is not None and self._tls_protocol is None:
            self.runtime.stats.count(self.runtime.name, "starttls")
            if self.runtime.behaviour.starttls_reply:
                await self.push(self.runtime.behaviour.starttls_reply)
                return
        await super().smtp_STARTTLS(arg)


def make_tls_context(names: list[str]) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (EC P-256: generated in ~1 ms)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "verimail testbed")])
    now = datetime.datetime.now(datetime.UTC)
    alt: list[x509.GeneralName] = [x509.DNSName("localhost")]
    alt += [x509.DNSName(n) for n in names[:100]]
    alt.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(key, hashes.SHA256())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # ssl can only load a chain from files; they live just long enough to be read.
    with tempfile.TemporaryDirectory(prefix="verimail-testbed-") as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context.load_cert_chain(cert_path, key_path)
    return context


def blocklisted(behaviour: HostBehaviour, client: str | None) -> str:
    """The refusal of a blocklisted client: the host's own text, or Postfix's."""
    if behaviour.blocklist_reply:
        return behaviour.blocklist_reply.replace("{ip}", client or "")
    return REPLY_BLOCKLISTED.format(ip=client)


def _client_ip(session: TestbedSMTP) -> str | None:
    """The connecting client's IP address (the egress a verifier came through)."""
    peer = session.session.peer if session.session is not None else None
    return str(peer[0]) if peer else None
