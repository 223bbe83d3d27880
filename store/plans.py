"""Plans and their limits (SPEC §8), as data the API's rate limiter and the credit code read.

"Monthly credits" in SPEC §8 are a per-period *allowance* spent before prepaid credits and
reset at the start of each UTC calendar period (a day for Free, whose row says "25 per
day", a month for the paid plans). Enterprise is "custom": no allowance here — operators
grant prepaid credits instead — and no fixed request or concurrency limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Period = Literal["day", "month"]


class UnknownPlan(ValueError):
    """A plan name that is not one of :data:`PLANS`."""


@dataclass(frozen=True)
class Plan:
    """Limits of one plan; ``None``: unlimited (rate, concurrency) or custom/none (allowance)."""

    name: str
    requests_per_minute: int | None
    allowance: int | None
    period: Period
    concurrent: int | None


PLANS: dict[str, Plan] = {
    plan.name: plan
    for plan in (
        Plan("free", requests_per_minute=10, allowance=25, period="day", concurrent=1),
        Plan("starter", requests_per_minute=60, allowance=5_000, period="month", concurrent=5),
        Plan("pro", requests_per_minute=120, allowance=10_000, period="month", concurrent=10),
        Plan("business", requests_per_minute=300, allowance=50_000, period="month", concurrent=25),
        # "Custom": no built-in allowance (operators grant credits), no fixed limits.
        Plan(
            "enterprise", requests_per_minute=None, allowance=None, period="month", concurrent=None
        ),
    )
}

PLAN_NAMES: tuple[str, ...] = tuple(PLANS)


def get_plan(name: str) -> Plan:
    """The plan called ``name``; raises :class:`UnknownPlan` for anything else."""
    try:
        return PLANS[name]
    except KeyError:
        raise UnknownPlan(f"unknown plan {name!r}; choose one of {', '.join(PLANS)}") from None
