"""The direct egress: sessions leave from this machine's own address (we dial)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verimail.engine.smtp.egress import Egress

DIRECT = "direct"
"""The name of the one egress when no proxy and no egress file is configured."""


def takes(url: str | None) -> bool:
    return url is None


async def open_socket(egress: Egress, ip: str, port: int, timeout: float) -> socket.socket | None:
    """None: the caller dials."""
    return None


def unreachable_advice(egress: Egress, doc: str) -> str:
    # (A direct egress of an egress file, under a name of its own, gets the proxy's advice,
    # as it did before the kinds had modules: a wording to revisit, kept by the move.)
    if egress.name == DIRECT:
        return (
            "outbound port 25 is blocked from this machine: set "
            f"VERIMAIL_SMTP_PROXY=socks5://… ({doc})."
        )
    return (
        f"the proxy of egress {egress.name} cannot reach port 25: use a proxy whose "
        f"provider allows outbound SMTP ({doc})."
    )


def failed_advice(egress: Egress, doc: str) -> str:
    # (Not met: a direct egress has no proxy to fail; the wording every kind had before.)
    return f"fix or replace the SOCKS5 proxy of egress {egress.name} ({doc})."
