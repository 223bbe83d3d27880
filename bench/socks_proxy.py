"""A real SOCKS5 proxy on loopback for the suite and the egress benchmark: ``pproxy`` (a
dev dependency, no code of ours) run as a subprocess, its verbose log kept in a file; and
``asyncio-socks-server`` (:class:`DialingSocksProxy`), which answers a request only once it
has dialled the destination.

``pproxy -v`` logs a line per connection it makes (``socks5 127.0.0.1:41234 ->
127.0.0.9:2525``) and per destination its block rule refuses (``BLOCK 127.0.0.9 from
127.0.0.1``): :meth:`SocksProxy.destinations` and :meth:`SocksProxy.blocked` read them, so a
test sees which servers were asked for through which proxy. pproxy connects out from the
address it listens on (its ``@`` bind), so two proxies on 127.0.0.2 and 127.0.0.3 are two
client addresses to the testbed (and to its postgrey-style greylisting).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verimail.runners.testing import free_port

_CONNECTED = re.compile(r"socks5 \S+ -> ([0-9a-f.:]+):(\d+)")
_BLOCKED = re.compile(r"BLOCK (\S+) from")
_STREAM = re.compile(r"Established TCP stream between \(.*?\) and \('([0-9a-f.:]+)', (\d+)\)")
START_TIMEOUT = 20.0
# pproxy installs uvloop when it can import it (uvicorn[standard] brings it), then asks for
# the event loop the old way, which uvloop refuses: run it on asyncio's own loop.
_LAUNCH = (
    "import sys; sys.modules['uvloop'] = None; sys.argv[0] = 'pproxy'; "
    "from pproxy.server import main; main()"
)


class SocksProxy:
    """pproxy listening for SOCKS5 on ``host``, with ``user``:``password`` (RFC 1929) when
    given and a ``block`` regex of destination addresses it refuses."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        user: str | None = None,
        password: str | None = None,
        block: str | None = None,
    ) -> None:
        self.host = host
        self.user, self.password = user, password
        self.block = block
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log = Path(tempfile.mkstemp(prefix="pproxy-", suffix=".log")[1])

    @property
    def url(self) -> str:
        auth = f"{self.user}:{self.password}@" if self.user else ""
        return f"socks5://{auth}{self.host}:{self.port}"

    def url_with(self, password: str) -> str:
        """The URL with another password (a wrong one, for the tests)."""
        return f"socks5://{self.user}:{password}@{self.host}:{self.port}"

    def start(self) -> SocksProxy:
        self.port = self.port or free_port(self.host)
        # "/@host": connect out from the listening address (pproxy's lbind), so that two
        # proxies are two client addresses to the servers
        listen = f"socks5://{self.host}:{self.port}/@{self.host}"
        if self.user:
            listen += f"#{self.user}:{self.password}"
        command = [sys.executable, "-c", _LAUNCH, "-l", listen, "-v"]
        command += ["--auth", "0"]  # (else pproxy trusts an address that once logged in)
        if self.block:
            command += ["-b", "{" + self.block + "}"]
        self._launch(command, "Serving on")
        return self

    def _launch(self, command: list[str], ready: str) -> None:
        """Start ``command``, its output in the log, and wait for ``ready`` in it."""
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + START_TIMEOUT
        while ready not in self.log():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the SOCKS5 proxy did not start: {self.log()[-500:]}")
            time.sleep(0.02)  # (polling its log: the proxy says nothing else when ready)

    def stop(self) -> None:
        """Stop the proxy (the log stays readable until :meth:`remove`)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def restart(self) -> None:
        """Start again on the same port (after :meth:`stop`)."""
        self.start()

    def remove(self) -> None:
        self.stop()
        self._log.unlink(missing_ok=True)

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    def destinations(self) -> list[str]:
        """``ip:port`` of every connection the proxy made, in order."""
        return [f"{ip}:{port}" for ip, port in _CONNECTED.findall(self.log())]

    def blocked(self) -> list[str]:
        """Destinations its block rule refused."""
        return _BLOCKED.findall(self.log())

    def __enter__(self) -> SocksProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()


class DialingSocksProxy(SocksProxy):
    """``asyncio-socks-server`` (a dev dependency) on ``host``: unlike pproxy, it dials the
    destination before it answers the SOCKS request, as RFC 1928 has it (and Dante does),
    so a destination that refuses the connection comes back as reply 5, "connection
    refused". No authentication and no rules."""

    def start(self) -> DialingSocksProxy:
        self.port = self.port or free_port(self.host)
        command = [sys.executable, "-m", "asyncio_socks_server", "-H", self.host]
        command += ["-P", str(self.port), "--access-log"]
        self._launch(command, "Server launched")
        return self

    def refused(self) -> int:
        """How many destinations refused the connections it made for us."""
        return self.log().count("Connection was refused")

    def destinations(self) -> list[str]:
        """``ip:port`` of every connection the proxy made, in order."""
        return [f"{ip}:{port}" for ip, port in _STREAM.findall(self.log())]
