"""Dates and times in query strings, as the document states them: text, never a number.

Pydantic alone reads ``0`` or ``0.5`` as a Unix time; the document says ``format: date`` or
``date-time``, and a script that sent a number meant something else. These types refuse it
in words before Pydantic's own parsing.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Annotated

from pydantic import BeforeValidator

from verimail.schemas.limits import DATE_TEXT

_DATE = re.compile(DATE_TEXT)


def _date_text(value: object) -> object:
    if isinstance(value, date) or (isinstance(value, str) and _DATE.fullmatch(value)):
        return value
    raise ValueError("a date such as 2026-11-30 is expected (not a number)")


def _date_time_text(value: object) -> object:
    if isinstance(value, date) or (isinstance(value, str) and _DATE.match(value)):
        return value
    raise ValueError(
        "a date or date-time such as 2026-11-30 or 2026-11-30T09:00:00Z is expected (not a number)"
    )


QueryDate = Annotated[date, BeforeValidator(_date_text)]
"""A day in a query string: ``YYYY-MM-DD``."""
QueryDateTime = Annotated[datetime, BeforeValidator(_date_time_text)]
"""A time in a query string: ISO 8601, a date alone being its midnight."""
