"""What the work costs, in one place: every charge and reservation asks here, so a price
never appears as a literal at a call site (SPEC: 1 credit per address verified; a verified
Email Finder find costs ``finder_charge``, a find that verifies nothing is free).

The mechanics of paying — pools, charge-before-work, reservations and refunds — are the
rest of ``store/billing/``; this module only says how much.
"""

from __future__ import annotations

from typing import Literal

from verimail.config import Settings

VERIFY_CREDITS = 1
"""Credits per verified address (duplicates included: each submitted address is charged)."""

Work = Literal["verify", "find"]


def price(kind: Work, count: int, settings: Settings | None = None) -> int:
    """Credits for ``count`` units of ``kind``: addresses verified, or finds that verified
    an address (``settings`` gives the finder's price; it is needed for ``find``)."""
    if count < 0:
        raise ValueError(f"cannot price {count} units")
    if kind == "verify":
        return VERIFY_CREDITS * count
    if settings is None:
        raise ValueError("the finder's price is a setting: pass settings")
    return settings.finder_charge * count
