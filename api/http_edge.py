"""uvicorn, bounded: the header size limit, the header read timeout and the connection cap.

The server runs uvicorn with h11 as its HTTP/1.1 parser because h11 bounds what it buffers
(``h11_max_incomplete_event_size``: the request line plus headers); httptools, uvicorn's
faster default, accepts a header of any size. uvicorn itself has no header read timeout and
its ``limit_concurrency`` answers a plain-text 503, so :class:`BoundedH11Protocol` adds:

- a **header timeout**: a connection that has not sent a whole header section within
  ``http_header_timeout`` seconds of its first byte (or of being opened) gets a 408 and is
  closed — slowloris clients cannot hold connections open by dripping header lines;
- a **connection cap**: a request on a connection opened while ``http_max_connections``
  others are open gets a JSON 503 with ``Retry-After`` and the connection is closed;
- JSON bodies for the parser's own refusals (431 headers too large, 400 not HTTP);
- a **lingering close**: when the server closes a connection while the client is still
  sending (an answer given before the body was read, a refusal of the parser), it first
  shuts its sending side (the client sees the answer and then the end of the stream) and
  reads and discards at most ``LINGER_BYTES`` or ``LINGER_SECONDS`` before closing for
  good. Closing at once with unread data makes the kernel send a reset, which can destroy
  the answer before the client has read it; draining for ever (uvicorn's way of keeping an
  unread body's connection alive) lets one client without a key make the server read
  gigabytes.

Body size and body read timeout are the app's business (:mod:`verimail.api.body_limit`), so
they hold in-process too. Use :func:`server_options` wherever uvicorn is started.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from verimail.api.body_limit import size_text
from verimail.api.errors import error_response
from verimail.config import Settings

OVER_CAPACITY_RETRY_AFTER = 1  # seconds: connections free up quickly
LINGER_BYTES = 256 * 1024  # what a closing connection reads, at most, for the answer's sake
LINGER_SECONDS = 0.5


class _LingeringTransport:
    """The connection's transport, whose ``close`` lingers (see the module doc) while the
    client may still be sending; everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, protocol: BoundedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if self._protocol.client_may_be_sending() and self._transport.can_write_eof():
            self.lingering = True
            self._transport.write_eof()  # (after what is buffered: the answer)
            self._transport.resume_reading()
            self._protocol.loop.call_later(LINGER_SECONDS, self.close_now)
        else:
            self._transport.close()

    def close_now(self) -> None:
        self.lingering = False
        self._transport.close()


class _Connection(h11.Connection):
    """h11's connection, remembering the protocol error it raised (to answer its status)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap (class attributes
    set by :func:`bounded_protocol`)."""

    header_timeout: float = 10.0
    max_connections: int = 500
    max_header_bytes: int = 16 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.max_header_bytes)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.closer = _LingeringTransport(transport, self)
        self.transport = self.closer  # type: ignore[assignment]  # (uvicorn closes through it)
        self._lingered = 0
        if len(self.connections) > self.max_connections:
            self.app = self._over_capacity
            self.logger.warning("Over the connection cap of %d: 503", self.max_connections)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        if self.closer.lingering:  # closing: what comes now is counted, never parsed
            self._lingered += len(data)
            if self._lingered >= LINGER_BYTES:
                self.closer.close_now()
            return
        super().data_received(data)
        self._watch_headers()

    def eof_received(self) -> bool | None:
        if self.closer.lingering:  # the client has stopped sending: close now
            self.closer.close_now()
        return None

    def client_may_be_sending(self) -> bool:
        """Whether the client may still be sending this request (its body, its headers)."""
        return self.conn.their_state not in (h11.DONE, h11.IDLE, h11.CLOSED)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    # --- header timeout ---------------------------------------------------------------

    def _watch_headers(self) -> None:
        """Arm the header deadline while a request's headers are awaited; stop it after."""
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            self._stop_header_timer()
        elif self._header_timer is None and self.timeout_keep_alive_task is None:
            # (between requests, uvicorn's keep-alive timeout covers a silent client)
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self._answer_and_close(
            408,
            f"The request headers did not arrive within {self.header_timeout:g} s; "
            "the connection is closed.",
        )

    # --- refusals -----------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """The parser refused the request: 431 if its headers are too large, else 400."""
        error = self.conn.last_error
        if error is not None and error.error_status_hint == 431:
            self._answer_and_close(
                431,
                "The request line and headers are larger than the limit of "
                f"{size_text(self.max_header_bytes)}; nothing was done.",
            )
        else:
            self._answer_and_close(400, "The request is not valid HTTP/1.1; nothing was done.")

    def _answer_and_close(self, status: int, detail: str) -> None:
        """Write a JSON error straight to the socket (no request may have been parsed), and
        log it in the access log like every other answer (``-`` for the unparsed request:
        operators count answers by status there)."""
        if self.access_log:
            client = "%s:%d" % self.client if self.client else "-"  # noqa: UP031 (uvicorn's)
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', client, "-", "-", "1.1", status)
        body = json.dumps({"detail": detail}).encode()
        reason = HTTPStatus(status).phrase
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.transport.close()

    async def _over_capacity(self, scope: Any, receive: Any, send: Any) -> None:
        detail = (
            f"The server has too many open connections (limit {self.max_connections}); "
            "try again shortly."
        )
        headers = {"Retry-After": str(OVER_CAPACITY_RETRY_AFTER), "Connection": "close"}
        await error_response(503, detail, headers=headers)(scope, receive, send)


def bounded_protocol(settings: Settings) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` with the limits of ``settings``."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {
            "header_timeout": settings.http_header_timeout,
            "max_connections": settings.http_max_connections,
            "max_header_bytes": settings.http_max_header_bytes,
        },
    )


def server_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments that make ``uvicorn.run``/``uvicorn.Config`` bounded."""
    return {
        "http": bounded_protocol(settings),
        "h11_max_incomplete_event_size": settings.http_max_header_bytes,
    }
