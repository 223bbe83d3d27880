"""The overview's pictures: results across all the account's jobs, credits spent per day."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from sqlalchemy import Engine

from verimail.api.dashboard.charts import breakdown, daily_bars, job_slices
from verimail.store.billing import daily_spending
from verimail.store.db import utcnow
from verimail.store.jobs import result_totals

USAGE_DAYS = 30


async def account_charts(engine: Engine, account_id: int) -> dict[str, Any]:
    """``totals_chart`` (every bulk job's results by status) and ``usage_chart`` (credits
    spent on each of the last :data:`USAGE_DAYS` days, UTC), as SVG."""
    today = utcnow().date()

    def read() -> tuple[dict[str, int], list[int]]:
        totals = result_totals(engine, account_id)
        return totals, daily_spending(engine, account_id, USAGE_DAYS, today=today)

    totals, spent = await to_thread.run_sync(read)
    return {
        "totals_chart": breakdown(
            job_slices(totals), title="Results of all your bulk jobs, by status"
        ),
        "usage_chart": daily_bars(
            spent, today, title=f"Credits spent per day, last {USAGE_DAYS} days (UTC)"
        ),
        "spent_total": sum(spent),
    }
