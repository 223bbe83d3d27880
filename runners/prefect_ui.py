"""A Prefect server with its UI on a known port, for the demo and ``verimail serve``.

Without it a process running flows (the local runner) starts Prefect's temporary server: a
random port, never announced, and no UI (Prefect turns the UI off there). A data team on
one machine wants to see the runs, the run names and the summary artifacts, and to start
a deployment from a form; so the demo (by default) and ``verimail serve`` (with
``--prefect-ui-port`` / ``VERIMAIL_PREFECT_UI_PORT``) start a full Prefect server on
``127.0.0.1:<port>`` instead, and point this process's Prefect client at it.

- Bound to 127.0.0.1 only: the Prefect UI has no login. Several machines use a Prefect
  server of their own (``PREFECT_API_URL``, the deployment runner).
- Prefect's analytics are off (the server's and this process's).
- Its database is ``<data_dir>/prefect.db`` (unless ``PREFECT_API_DATABASE_CONNECTION_URL``
  names one): the runs and artifacts stay with the rest of the installation's state.

Must run before ``prefect`` is imported in this process: Prefect reads ``PREFECT_API_URL``
from the environment once, at import.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from verimail.runners.processes import stop_process

START_TIMEOUT = 120.0  # seconds: a first start migrates a new database (~10-20 s)
STOP_TIMEOUT = 10.0
HOST = "127.0.0.1"


class PrefectUIError(RuntimeError):
    """The Prefect server could not be started; the message says why in one sentence."""


def port_free(port: int, host: str = HOST) -> bool:
    """Nothing listens on ``host:port`` (so a server may bind it).

    Binds as the servers do, with ``SO_REUSEADDR``: connections of a server stopped a
    moment ago linger in TIME_WAIT for a minute, and a plain bind counted them as "in use",
    so a demo restarted at once lost its Prefect UI (uvicorn binds over them all the same).
    A listening socket still makes the bind fail."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PrefectUIServer:
    """One ``prefect.server`` process (API + UI) owned by this process."""

    def __init__(self, port: int, data_dir: Path) -> None:
        self.port = port
        self.data_dir = Path(data_dir)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The UI's address (what a person opens)."""
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def _environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "true",
            "PREFECT_UI_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_API_HOST": HOST,
            "PREFECT_SERVER_API_PORT": str(self.port),
        }
        env.pop("PREFECT_API_URL", None)  # (the server is the API; it is no client of one)
        env.setdefault(
            "PREFECT_API_DATABASE_CONNECTION_URL",
            f"sqlite+aiosqlite:///{(self.data_dir / 'prefect.db').resolve()}",
        )
        return env

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the server and wait until its API answers; :class:`PrefectUIError` if not."""
        if not port_free(self.port):
            raise PrefectUIError(f"port {self.port} on {HOST} is in use")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / "prefect-server.log"
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "prefect.server.api.server:create_app",
                    "--host",
                    HOST,
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                ],
                env=self._environment(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2) as client:
            while True:
                if self.process.poll() is not None:
                    self.process = None
                    raise PrefectUIError(
                        f"the Prefect server exited at start-up (its log: {log_path})"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    self.stop()
                    raise PrefectUIError(
                        f"the Prefect server did not answer within {timeout:.0f} s "
                        f"(its log: {log_path})"
                    )
                time.sleep(0.1)  # (a subprocess starting: nothing to await but its port)

    def stop(self) -> None:
        """Stop the server (terminate, then kill if it does not end in time)."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, STOP_TIMEOUT)


def use_prefect_server(api_url: str) -> None:
    """Point this process's Prefect client at ``api_url``, analytics off (before import)."""
    os.environ["PREFECT_API_URL"] = api_url
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@contextlib.contextmanager
def prefect_ui(port: int, data_dir: Path) -> Iterator[PrefectUIServer]:
    """A started Prefect server with UI that this process's flows report to; stopped after."""
    if "prefect" in sys.modules:  # (too late: the client would keep its old server)
        raise PrefectUIError("Prefect was imported before its UI server could be set up")
    server = PrefectUIServer(port, data_dir)
    server.start()
    previous = os.environ.get("PREFECT_API_URL")
    use_prefect_server(server.api_url)
    try:
        yield server
    finally:
        if "prefect" in sys.modules:  # the runs' last log lines, while the server is there
            from verimail.runners.local import send_pending_logs

            send_pending_logs()
        server.stop()
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
