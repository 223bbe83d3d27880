"""The SOCKS5 egress: a proxy dials for us (RFC 1928, with RFC 1929 user name and password).

verimail resolves the MX hosts itself and asks the proxy for the *address*: the
private-range guard (:mod:`verimail.engine.netguard`) has decided on it before the proxy is
asked. The SOCKS protocol is python-socks'; this module only words its failures
(:class:`~verimail.engine.smtp.egress.EgressFailed`) and keeps the password out of them.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

from python_socks import ProxyConnectionError, ProxyError, ProxyTimeoutError
from python_socks.async_.asyncio import Proxy

from verimail.config import proxy_parts
from verimail.engine.smtp.egress_kinds.failed import EgressFailed

if TYPE_CHECKING:
    from verimail.engine.smtp.egress import Egress

# SOCKS5 replies (RFC 1928 §6) that say the destination, not the proxy, failed: read as a
# direct dial's refusal or time-out would be, so verdicts match a direct run's.
_UNREACHABLE = {0x03: errno.ENETUNREACH, 0x04: errno.EHOSTUNREACH, 0x05: errno.ECONNREFUSED}
_TTL_EXPIRED = 0x06
_NOT_ALLOWED = 0x02


def takes(url: str | None) -> bool:
    return url is not None


def unreachable_advice(egress: Egress, doc: str) -> str:
    return (
        f"the proxy of egress {egress.name} cannot reach port 25: use a proxy whose "
        f"provider allows outbound SMTP ({doc})."
    )


def failed_advice(egress: Egress, doc: str) -> str:
    return f"fix or replace the SOCKS5 proxy of egress {egress.name} ({doc})."


async def open_socket(egress: Egress, ip: str, port: int, timeout: float) -> socket.socket | None:
    """A socket connected through ``egress``'s proxy to ``ip``:``port``; None for a direct
    egress (the caller dials). :class:`EgressFailed` for a fault of the proxy; an
    ``OSError``/``TimeoutError`` when the proxy reports the destination unreachable or
    refusing, as a direct dial would have met it."""
    if egress.proxy_url is None:
        return None
    host, proxy_port, user, _ = proxy_parts(egress.proxy_url)
    proxy = Proxy.from_url(egress.proxy_url, rdns=False)
    where = f"the SOCKS5 proxy {host}:{proxy_port} (egress {egress.name})"
    try:
        return await proxy.connect(dest_host=ip, dest_port=port, timeout=timeout)
    except ProxyTimeoutError:
        # A proxy answers once it has reached the server: no answer in time is a server (or
        # a proxy) that did not answer, read as a direct dial's time-out — as the caller's
        # own deadline, which expires at the same moment, reads it (docs/egress.md).
        raise TimeoutError(f"{where} did not connect us within {timeout:g} s") from None
    except ProxyConnectionError as exc:
        raise EgressFailed(
            egress, "proxy_unreachable", f"{where} could not be reached ({exc.strerror or exc})."
        ) from None
    except ProxyError as exc:
        code = exc.error_code
        if code in _UNREACHABLE:
            raise OSError(_UNREACHABLE[code], f"{exc} (reported by {where})") from None
        if code == _TTL_EXPIRED:
            raise TimeoutError(f"{exc} (reported by {where})") from None
        if code == _NOT_ALLOWED:
            raise EgressFailed(
                egress,
                "destination_refused",
                f"{where} refused to connect us to {ip}:{port} (not allowed by its rules).",
            ) from None
        if code is not None:
            refused = f"{where} could not connect us to {ip}:{port}: {exc}."
            raise EgressFailed(egress, "destination_refused", refused) from None
        # No reply code: the proxy refused our user name and password (RFC 1929 status), or
        # closed the connection during the handshake, which is how some proxies (pproxy)
        # refuse them or a client without any.
        named = "the user name and password of the URL" if user else "no user name and password"
        raise EgressFailed(
            egress,
            "proxy_auth_refused",
            f"{where} refused authentication with {named} ({exc}).",
        ) from None
