"""Opaque page cursors of the API's lists (jobs, the credit ledger).

A cursor names the last row a page showed; clients pass it back unchanged. It is opaque
(base64 of a tag and an id) so that clients do not build their own, and tagged by list, so
a ledger cursor sent to the jobs list is refused in words instead of paging wrongly. It
carries no account: the list is always the caller's own, whatever the cursor says.
"""

from __future__ import annotations

import base64
import binascii
import re

from verimail.api.errors import ApiError
from verimail.schemas.limits import MAX_INT

_SHAPE = re.compile(r"([a-z]):([1-9][0-9]{0,9})")


def encode_cursor(tag: str, row_id: int | None) -> str | None:
    """The cursor of the page after the one that ended at ``row_id`` (None: no next page)."""
    if row_id is None:
        return None
    return base64.urlsafe_b64encode(f"{tag}:{row_id}".encode()).decode().rstrip("=")


def decode_cursor(tag: str, cursor: str | None) -> int | None:
    """The row id ``cursor`` stands for (None without one); 422 for anything this list did
    not give out."""
    if cursor is None or cursor == "":
        return None
    refused = ApiError(
        422,
        "cursor: not a cursor of this list; pass the next_cursor of the previous page "
        "unchanged (or leave it out for the first page).",
    )
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raise refused from None
    match = _SHAPE.fullmatch(text)
    if match is None or match[1] != tag or int(match[2]) > MAX_INT:
        raise refused
    return int(match[2])
