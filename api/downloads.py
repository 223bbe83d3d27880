"""Result downloads: the whole file, always.

Starlette's ``FileResponse`` answers ``Range`` requests with 206, and malformed or
unsatisfiable ranges with a plain-text 400 or 416 — statuses and bodies outside the API's
contract (every error is ``{"detail": str}``). Results files are small enough to fetch
whole, and RFC 9110 lets a server ignore ``Range``: so it is ignored and ``Accept-Ranges:
none`` says so.
"""

from __future__ import annotations

from fastapi.responses import FileResponse
from starlette.types import Receive, Scope, Send

_RANGE_HEADERS = (b"range", b"if-range")


class WholeFileResponse(FileResponse):
    """A ``FileResponse`` that always sends the whole file with 200."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.headers["accept-ranges"] = "none"
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _RANGE_HEADERS]
        await super().__call__({**scope, "headers": headers}, receive, send)
