"""The kinds of egress, one module each: how a session's socket leaves this machine
(:mod:`.direct`: we dial; :mod:`.socks5`: a SOCKS5 proxy dials for us) and what to advise
when that way out fails.

A kind is a module with the three names of :class:`EgressKind`; :func:`kind_of` picks the
first in :data:`KINDS` that takes an egress's URL. ``engine/smtp/egress.py`` dials through
it and ``egress_check.py`` words its advice from it, so a new kind is a module here, listed
in :data:`KINDS` (its URL's start-up check, if it has one, stays with the settings,
``config/egress.py``: the settings are checked before any engine exists, and the engine
imports the settings, not the other way round).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Protocol

from verimail.engine.smtp.egress_kinds import direct, socks5

if TYPE_CHECKING:
    from verimail.engine.smtp.egress import Egress


class EgressKind(Protocol):
    """What a kind of egress module provides."""

    def takes(self, url: str | None) -> bool:
        """Whether an egress with this URL (None: no URL, direct) is of this kind."""

    async def open_socket(
        self, egress: Egress, ip: str, port: int, timeout: float
    ) -> socket.socket | None:
        """A socket connected to ``ip``:``port`` through ``egress``; None when the caller
        dials itself."""

    def unreachable_advice(self, egress: Egress, doc: str) -> str:
        """What to do when port 25 cannot be reached (or does not answer) this way."""

    def failed_advice(self, egress: Egress, doc: str) -> str:
        """What to do when the way out itself failed (``egress_failed``)."""


KINDS: tuple[EgressKind, ...] = (direct, socks5)
"""Every kind, in the order they are asked whether they take a URL."""


def kind_of(egress: Egress) -> EgressKind:
    """The kind ``egress`` is of (the settings checked its URL at start-up)."""
    for kind in KINDS:
        if kind.takes(egress.proxy_url):
            return kind
    raise ValueError(f"egress {egress.name}: no kind of egress takes its URL")
