"""Which IP addresses we may connect to: the prober's mail hosts and the webhooks' receivers.

An MX record (or a webhook URL) is attacker-chosen data: without this guard anyone could
point a domain at 10.0.0.5 and use the service to scan our internal network. Only
globally routable unicast addresses are allowed, plus the networks the caller names
(``smtp_allow_networks`` for the prober, ``webhook_allow_networks`` for webhooks; the
testbed allows exactly ``127.0.0.0/8``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Not routable on the internet, though Python 3.11's ``is_global`` says they are:
# IETF protocol assignments (RFC 6890) and IPv6 site-local (RFC 3879, deprecated, still
# routed inside some networks).
_NOT_GLOBAL: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("fec0::/10"),
)


def connect_allowed(address: str, allow_networks: Iterable[IPNetwork]) -> bool:
    """True when ``address`` is a public unicast address or lies in an allowed network."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    # 2002:a00:1:: is 6to4 for 10.0.0.1: Python calls it global, but a host with a 6to4
    # route would deliver it to the embedded IPv4 address, so that must pass as well.
    sixtofour = ip.sixtofour if isinstance(ip, ipaddress.IPv6Address) else None
    if sixtofour is not None and not connect_allowed(str(sixtofour), allow_networks):
        return False
    for net in allow_networks:
        if ip.version == net.version and ip in net:
            return True
    if any(ip.version == net.version and ip in net for net in _NOT_GLOBAL):
        return False
    return bool(
        ip.is_global
        and not (
            ip.is_multicast
            or ip.is_private
            or ip.is_loopback
            or ip.is_link_local
            or ip.is_reserved
            or ip.is_unspecified
        )
    )
