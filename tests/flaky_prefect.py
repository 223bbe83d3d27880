"""A loopback HTTP proxy in front of the session's Prefect server that answers 503 to the
API requests it is told to, then forwards again: a Prefect server having a bad minute, for
tests of what a run does then (issue 47.7).

It forwards HTTP requests (``httpx``) and refuses WebSockets (Prefect's events and logs
streams: their clients drop what they cannot send and retry later, which is not under
test here)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from verimail.runners.testing import free_port

HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


@dataclass
class FlakyPrefect:
    """The proxy's state: ``refuse(method, path)`` says whether to answer this request 503;
    ``refused`` and ``forwarded`` count the requests (method, path) answered each way."""

    upstream: str
    refuse: Callable[[str, str], bool] = lambda method, path: False
    refused: list[tuple[str, str]] = field(default_factory=list)
    forwarded: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        with self.lock:
            refuse = self.refuse(method, path)
            (self.refused if refuse else self.forwarded).append((method, path))
        if refuse:
            await _answer(send, 503, [(b"content-type", b"application/json")], b'{"detail":"x"}')
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        url = self.upstream.rstrip("/") + path
        query = scope.get("query_string", b"").decode()
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.request(
                method, url + (f"?{query}" if query else ""), headers=headers, content=body
            )
        kept = [
            (k.encode(), v.encode())
            for k, v in answer.headers.items()
            if k.encode().lower() not in HOP_BY_HOP and k.lower() != "content-encoding"
        ]
        await _answer(send, answer.status_code, kept, answer.content)


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def flaky_prefect(upstream: str) -> Iterator[tuple[FlakyPrefect, str]]:
    """The proxy in front of ``upstream`` (a Prefect server's root, without ``/api``), on a
    thread of its own: (its state, its API URL)."""
    proxy = FlakyPrefect(upstream)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(proxy, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="flaky-prefect", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the flaky Prefect proxy did not start")
            time.sleep(0.05)
        yield proxy, f"http://127.0.0.1:{port}/api"
    finally:
        server.should_exit = True
        thread.join(30)
