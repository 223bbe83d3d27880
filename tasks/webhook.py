"""Job-completion webhooks: one signed POST of the final job, retried, never to internal hosts.

Each job with a ``webhook_url`` gets its own random signing secret, returned once when the
job is created. The POST body is the job as JSON; ``X-Verimail-Signature: sha256=<hex>``
is the HMAC-SHA256 of ``<timestamp>.<body>`` with that secret and
``X-Verimail-Timestamp`` the Unix time, so a receiver can reject forgeries and replays.

The URL is user-chosen, so it gets the same guard as MX records: every address the host
resolves to must be public (or in ``webhook_allow_networks``), and the connection goes to
the address that was checked (the host name is kept for ``Host`` and TLS SNI), so a DNS
answer that changes between check and connect cannot redirect it inside our network.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from verimail.tasks.netguard import IPNetwork, smtp_address_allowed

RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}


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
    """Refuse what can be refused without DNS: bad schemes, private IP literals."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused("webhook_url must be an http:// or https:// URL with a host.")
    literal = _ip_literal(parts.hostname)
    if literal is not None and not smtp_address_allowed(literal, list(allow_networks)):
        raise WebhookRefused("webhook_url points at a private or reserved address.")


def _ip_literal(host: str) -> str | None:
    """The address a host name spells, in any form a resolver takes without DNS: dotted,
    IPv6, and the legacy IPv4 forms (``127.1``, ``2130706433``, ``0x7f000001``, ``0``)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))  # (inet_aton never asks DNS)
    except OSError:
        return None


async def _resolve(host: str, port: int, allow: list[IPNetwork]) -> str:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise WebhookRefused(f"{host} has no address.")
    bad = [a for a in addresses if not smtp_address_allowed(a, allow)]
    if bad:
        raise WebhookRefused(f"{host} resolves to a private or reserved address ({bad[0]}).")
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
    """POST ``payload`` to ``url``; retries on network errors and 5xx/429 with back-off."""
    allow = list(allow_networks)
    try:
        check_url(url, allow)
    except WebhookRefused as exc:
        return Delivery(False, 0, None, str(exc))
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    body = json.dumps(payload, default=str, separators=(",", ":")).encode()
    detail = ""
    status: int | None = None
    for attempt in range(1, attempts + 1):
        try:
            address = await _resolve(host, port, allow)
        except WebhookRefused as exc:
            return Delivery(False, attempt - 1, None, str(exc))
        except OSError as exc:
            detail = f"could not resolve {host}: {exc}"
        else:
            literal = f"[{address}]" if ":" in address else address
            pinned = urlunsplit(
                (parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, "")
            )
            now = int(time.time())
            headers = {
                "Host": parts.netloc.rpartition("@")[2],
                "Content-Type": "application/json",
                "User-Agent": "verimail-webhook/1",
                "X-Verimail-Timestamp": str(now),
                "X-Verimail-Signature": sign(secret, now, body),
            }
            try:
                async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                    response = await client.post(
                        pinned, content=body, headers=headers, extensions={"sni_hostname": host}
                    )
                status = response.status_code
                if 200 <= status < 300:
                    return Delivery(True, attempt, status, "delivered")
                detail = f"answered {status}"
                if status not in RETRY_STATUSES:
                    return Delivery(False, attempt, status, detail)
            except httpx.HTTPError as exc:
                detail = f"{type(exc).__name__}: {exc}"
        if attempt < attempts:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
    return Delivery(False, attempts, status, detail)
