"""Request bodies bounded at the edge: a size cap and a read timeout, before any route runs.

FastAPI reads a JSON body in full before it resolves dependencies, so without this a
200 MB body with no valid key would be held in memory before the 401. Here the body is
counted as it streams in: a declared ``Content-Length`` over the limit is refused before
a byte of the body is read, a chunked body the moment it passes the limit. Either way the
answer is 413 with the usual ``{"detail"}`` and ``Connection: close`` (the rest of the body
is never read). The CSV upload routes stream their bodies to disk under their own, larger
cap (``upload_max_bytes``); they are marked with :func:`streams_own_body` and exempt from
the size cap here, but not from the read timeout.

The read timeout bounds each wait for the next piece of the body (a client that sends a
byte now and then cannot hold a request open for ever): past it the answer is 408.

An answer given before the body has been read to its end (a 401 before an upload, a 404, a
health check sent with a body, a dashboard form refused or redirected) says
``Connection: close``: uvicorn then closes the connection after the answer instead of
reading and discarding the rest of the body for as long as the client sends it (its h11
protocol drains an unread body to keep the connection alive). The close itself lingers
briefly so the client can read the answer (:mod:`verimail.api.http_edge`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verimail.api.errors import error_response

STREAMS_OWN_BODY = "_verimail_streams_own_body"
CLOSE = (b"connection", b"close")

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def streams_own_body(endpoint: Endpoint) -> Endpoint:
    """Mark a route whose endpoint reads (and caps) its body itself: exempt from the size cap."""
    setattr(endpoint, STREAMS_OWN_BODY, True)
    return endpoint


def size_text(limit: int) -> str:
    """``4194304`` -> ``4 MiB``; small limits in bytes or KiB."""
    if limit >= 1024 * 1024:
        return f"{limit / (1024 * 1024):g} MiB"
    if limit >= 1024:
        return f"{limit / 1024:g} KiB"
    return f"{limit} bytes"


class BodyLimitMiddleware:
    """Pure ASGI: caps the body of every HTTP request whose endpoint is not marked with
    :func:`streams_own_body`, and times out slow bodies. Pure ASGI (not
    ``BaseHTTPMiddleware``) so the body is never buffered here.

    Which endpoint a request goes to is known once routing has run, and routing runs before
    any body is read: the cap is decided at the first read (``scope["endpoint"]``), which for
    JSON routes comes before the key is checked.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, read_timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout
        self.too_large = (
            f"The request body is larger than the limit of {size_text(max_bytes)}; "
            "nothing was done. Send at most 10,000 addresses per request, or upload a CSV."
        )
        self.too_slow = (
            f"The request body did not arrive in time (nothing for {read_timeout:g} s); "
            "nothing was done."
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0
        started = False
        body_done = not _has_body(scope)
        capped: bool | None = None  # decided at the first read, once the route is known

        async def bounded_receive() -> Message:
            nonlocal received, capped, body_done
            if body_done:
                # After the body, a read waits for the client to hang up (a streamed
                # download listens so): that wait is the response's, not bounded here.
                return await receive()
            if capped is None:
                capped = not getattr(scope.get("endpoint"), STREAMS_OWN_BODY, False)
                if capped and _declared_length(scope) > self.max_bytes:
                    raise self._refusal(413, self.too_large)
            try:
                async with asyncio.timeout(self.read_timeout):
                    message = await receive()
            except TimeoutError:
                raise self._refusal(408, self.too_slow) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if capped and received > self.max_bytes:
                    raise self._refusal(413, self.too_large)
                body_done = not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not body_done:  # answered early: never drain the rest of the body
                    message = _closing(message)
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except HTTPException as exc:  # raised by a reader outside FastAPI's handlers
            if started or exc.status_code not in (408, 413):
                raise
            response = error_response(exc.status_code, str(exc.detail), headers=exc.headers)
            await response(scope, receive, send)

    @staticmethod
    def _refusal(status: int, detail: str) -> HTTPException:
        """Raised from the body reader: FastAPI passes it to the app's error handler, which
        answers the usual ``{"detail"}``; ``Connection: close`` so the rest is never read."""
        return HTTPException(status, detail, headers={"Connection": "close"})


def _closing(start: Message) -> Message:
    """The response start ``start`` with ``Connection: close`` (once)."""
    headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, CLOSE]}


def _has_body(scope: Scope) -> bool:
    """Whether the request comes with a body (chunked, or a non-zero ``Content-Length``)."""
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            return True
    return False


def _declared_length(scope: Scope) -> int:
    """The ``Content-Length`` the client declared, or 0 (absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0
