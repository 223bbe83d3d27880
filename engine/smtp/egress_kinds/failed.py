"""A fault of an egress itself (its proxy), not of the mail server: the one exception every
kind of egress raises for it, so a session and the checks word it the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verimail.engine.smtp.egress import Egress


class EgressFailed(Exception):
    """A proxy fault: no session could be had through ``egress`` for reasons of the proxy,
    not of the mail server. ``kind`` is ``proxy_unreachable``, ``proxy_auth_refused`` or
    ``destination_refused``; ``reason`` is one sentence for a person (no password)."""

    KINDS = ("proxy_unreachable", "proxy_auth_refused", "destination_refused")

    def __init__(self, egress: Egress, kind: str, reason: str) -> None:
        assert kind in self.KINDS, kind
        super().__init__(reason)
        self.egress = egress
        self.kind = kind
        self.reason = reason
