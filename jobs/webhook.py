"""Job-completion webhooks: one signed POST of the final job, retried, never to internal hosts.

Each job with a ``webhook_url`` gets its own random signing secret, returned once when the
job is created. The POST body is the job as JSON; ``X-Verimail-Signature: sha256=<hex>``
is the HMAC-SHA256 of ``<timestamp>.<body>`` with that secret and
``X-Verimail-Timestamp`` the Unix time, so a receiver can reject forgeries and replays.

The URL is user-chosen, so it gets the same guard as MX records: every address the host
resolves to must be public (or in ``webhook_allow_networks``), and the connection goes to
the address that was checked (the host name is kept for ``Host`` and TLS SNI), so a DNS
answer that changes between check and connect cannot redirect it inside our network.

The host name is resolved twice: when the job is created (:func:`check_url_resolved`, so
that a name pointing inside is refused with 422 like a literal private address, instead of
a job whose webhook is silently skipped), and again at delivery, because DNS can change.
Both ask the system resolver (``getaddrinfo``: ``/etc/hosts`` included), so a name the
delivery would refuse is refused at creation too; creation also asks the resolver of the
mail checks (``VERIMAIL_DNS_NAMESERVERS``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx
import idna

from verimail.engine import IPNetwork, connect_allowed

if TYPE_CHECKING:
    from verimail.engine import DomainResolver

RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}
ALLOW_SETTING = "VERIMAIL_WEBHOOK_ALLOW_NETWORKS"
PRIVATE = (
    "webhook_url points at a private or reserved address (to allow a network of yours, "
    f"name it in {ALLOW_SETTING})."
)
SYSTEM_LOOKUP_TIMEOUT = 5.0
"""Seconds the creation check waits for the system resolver (then lets the URL through:
the delivery checks again)."""


class WebhookRefused(ValueError):
    """The URL may not be called (scheme, or an address inside a private network)."""


@dataclass(frozen=True)
class Delivery:
    delivered: bool
    attempts: int
    status_code: int | None
    detail: str


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def check_url(url: str, allow_networks: Iterable[IPNetwork]) -> None:
    """Refuse what can be refused without DNS: bad schemes, ports and host names, private
    IP literals."""
    _target(url, list(allow_networks))


async def check_url_resolved(
    url: str, allow_networks: Iterable[IPNetwork], resolver: DomainResolver
) -> None:
    """:func:`check_url`, and the host name resolved now: a name with an address inside a
    private or reserved network is refused in the words of a literal one. ``localhost`` and
    its subdomains are loopback whatever DNS says (RFC 6761). A name that does not resolve
    now is let through: DNS may be down for a moment, and the delivery checks again."""
    allow = list(allow_networks)
    _parts, host, port = _target(url, allow)
    if _ip_literal(host) is not None:
        return  # (checked by _target)
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        if not connect_allowed("127.0.0.1", allow):
            raise WebhookRefused(PRIVATE)
        return
    try:
        async with asyncio.timeout(SYSTEM_LOOKUP_TIMEOUT):
            system = await _system_addresses(host, port)
    except (OSError, TimeoutError):
        system = []  # (not resolvable now: let through, the delivery checks again)
    dns = (await resolver.addresses(name))[0]
    if any(not connect_allowed(a, allow) for a in [*system, *dns]):
        raise WebhookRefused(PRIVATE)


def _target(url: str, allow: list[IPNetwork]) -> tuple[SplitResult, str, int]:
    """(the URL's parts, its host as sent on the wire, its port), or WebhookRefused. A name
    in another script is sent in IDNA form (``bücher.example`` is ``xn--bcher-kva.example``):
    an HTTP ``Host`` header is ASCII."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # "http://[::1", or a host that NFKC-normalises into "/" or "@"
        raise WebhookRefused("webhook_url is not a valid URL.") from None
    if parts.scheme not in ("http", "https") or not hostname:
        raise WebhookRefused("webhook_url must be an http:// or https:// URL with a host.")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    elif not 1 <= port <= 65535:  # (port 0 was sent to the scheme's port)
        raise WebhookRefused("webhook_url has an invalid port (1 to 65535).")
    host = hostname
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError:
            raise WebhookRefused(f"webhook_url's host {host!r} is not a valid name.") from None
    literal = _ip_literal(host)
    if literal is None and not _HOST_NAME.fullmatch(host):
        raise WebhookRefused(f"webhook_url's host {hostname!r} is not a valid name.")
    if literal is not None and not connect_allowed(literal, allow):
        raise WebhookRefused(PRIVATE)
    return parts, host, port


# A DNS name as a URL may carry it: labels of letters, digits, "-" and "_" (as resolvers
# take them), 1 to 63 characters, not starting or ending with "-"; a trailing dot allowed.
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\.?$)({_LABEL}\.)*{_LABEL}\.?")


def _ip_literal(host: str) -> str | None:
    """The address a host name spells, in any form a resolver takes without DNS: dotted,
    IPv6, and the legacy IPv4 forms (``127.1``, ``2130706433``, ``0x7f000001``, ``0``)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))  # (inet_aton never asks DNS)
    except (OSError, ValueError):  # (ValueError: a NUL in the name)
        return None


async def _system_addresses(host: str, port: int) -> list[str]:
    """``host``'s addresses as the delivery connects to them: the system resolver
    (``/etc/hosts``, then DNS). ``OSError`` when it does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _resolve(host: str, port: int, allow: list[IPNetwork]) -> str:
    addresses = await _system_addresses(host, port)
    if not addresses:
        raise WebhookRefused(f"{host} has no address.")
    bad = [a for a in addresses if not connect_allowed(a, allow)]
    if bad:
        raise WebhookRefused(
            f"{host} resolves to a private or reserved address ({bad[0]}); "
            f"{ALLOW_SETTING} allows a network of yours."
        )
    return addresses[0]


async def deliver(
    url: str,
    payload: dict[str, Any],
    secret: str,
    *,
    allow_networks: Iterable[IPNetwork] = (),
    timeout: float = 10.0,
    attempts: int = 3,
    backoff: float = 1.0,
) -> Delivery:
    """POST ``payload`` to ``url``; retries on network errors and 5xx/429 with back-off.

    ``timeout`` bounds each whole attempt (resolving, connecting, sending, the status line),
    not each socket read: a receiver that answers a byte at a time must not hold the job's
    run. Only the status is read; the response body is never downloaded."""
    allow = list(allow_networks)
    try:
        parts, host, port = _target(url, allow)
    except WebhookRefused as exc:
        return Delivery(False, 0, None, str(exc))
    body = json.dumps(payload, default=str, separators=(",", ":")).encode()
    detail = ""
    status: int | None = None
    for attempt in range(1, attempts + 1):
        try:
            async with asyncio.timeout(timeout):
                status = await _post(parts, host, port, allow, body, secret, timeout)
        except WebhookRefused as exc:
            return Delivery(False, attempt - 1, None, str(exc))
        except TimeoutError:
            status, detail = None, f"no answer within {timeout:g} s"
        except OSError as exc:
            status, detail = None, f"could not resolve {host}: {exc}"
        except httpx.HTTPError as exc:
            status, detail = None, f"{type(exc).__name__}: {exc}"
        else:
            if 200 <= status < 300:
                return Delivery(True, attempt, status, "delivered")
            detail = f"answered {status}"
            if status not in RETRY_STATUSES:
                return Delivery(False, attempt, status, detail)
        if attempt < attempts:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
    return Delivery(False, attempts, status, detail)


async def _post(
    parts: SplitResult,
    host: str,
    port: int,
    allow: list[IPNetwork],
    body: bytes,
    secret: str,
    timeout: float,
) -> int:
    """One attempt: resolve and check the host, POST to the checked address; the status."""
    address = await _resolve(host, port, allow)
    literal = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    now = int(time.time())
    named = f"[{host}]" if ":" in host else host
    headers = {
        "Host": named if parts.port is None else f"{named}:{parts.port}",
        "Content-Type": "application/json",
        "User-Agent": "verimail-webhook/1",
        "X-Verimail-Timestamp": str(now),
        "X-Verimail-Signature": sign(secret, now, body),
    }
    async with (
        httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
        client.stream(
            "POST", pinned, content=body, headers=headers, extensions={"sni_hostname": host}
        ) as response,
    ):
        return response.status_code  # (leaving the block closes it without reading the body)
