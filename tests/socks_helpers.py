"""A real SOCKS5 proxy (``pproxy``, no code of ours) on loopback for the blocked-egress and
doctor tests. Told to (``/@in`` after its listening address: pproxy 2.7.9 connects out
from 127.0.0.1 otherwise), pproxy connects out from the address it listens on, so a proxy
on 127.0.0.2 is another client address than a direct session's 127.0.0.1 to the testbed.

(The egress branch has the fuller ``bench/socks_proxy.SocksProxy``; once both are merged,
these tests can use it and this file can go.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# pproxy installs uvloop when it can import it, then asks for a loop the old way, which
# uvloop refuses: run it on asyncio's own loop.
_LAUNCH = (
    "import sys; sys.modules['uvloop'] = None; sys.argv[0] = 'pproxy'; "
    "from pproxy.server import main; main()"
)


@contextmanager
def socks_proxy(host: str = "127.0.0.2") -> Iterator[str]:
    """A SOCKS5 proxy listening on ``host``; its URL. Stopped on leaving."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    # ("/@in": connect out from the address it listens on)
    command = [sys.executable, "-c", _LAUNCH, "-l", f"socks5://{host}:{port}/@in"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:  # (ready once it accepts connections)
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "no pproxy"
                time.sleep(0.02)
        yield f"socks5://{host}:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
