"""``verimail serve``: the API under uvicorn, settings from the environment (``VERIMAIL_*``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from enum import StrEnum
from types import FrameType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from verimail.config import Settings


class LogLevel(StrEnum):
    """uvicorn's log levels (anything else is a usage error, not a traceback at start-up)."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"
    trace = "trace"


def serve_command(
    host: str | None = typer.Option(
        None, "--host", help="Address to bind (default: VERIMAIL_API_HOST, else 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        min=1,
        max=65535,
        help="Port to bind (default: VERIMAIL_API_PORT, else 8000).",
    ),
    log_level: LogLevel = typer.Option(
        LogLevel.info, "--log-level", case_sensitive=False, help="uvicorn log level."
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None,
        "--forwarded-allow-ips",
        help="Proxies (comma-separated IPs, or *) whose X-Forwarded-For/-Proto are believed: "
        "behind a TLS-terminating proxy, so that the client's address is rate-limited and the "
        "dashboard cookie is Secure. Unset: the headers are ignored (a client could forge them).",
    ),
    prefect_ui_port: int | None = typer.Option(
        None,
        "--prefect-ui-port",
        min=1,
        max=65535,
        help="Also serve the Prefect UI (runs, artifacts, deployments) on 127.0.0.1 at this "
        "port (default: VERIMAIL_PREFECT_UI_PORT, else off). Local runner only.",
    ),
) -> None:
    """Serve the HTTP API (one process; run several behind a proxy with PostgreSQL + Redis)."""
    import uvicorn

    from verimail.api.app import create_app
    from verimail.api.http_edge import server_options
    from verimail.config import get_settings

    settings = get_settings()
    if settings.runner == "deployment":
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():  # (Prefect would start a throwaway server of its own)
            typer.echo(
                "VERIMAIL_RUNNER=deployment needs the Prefect server the workers use: set "
                "PREFECT_API_URL (e.g. http://prefect.internal:4200/api).",
                err=True,
            )
            raise typer.Exit(2)
    ui_port = prefect_ui_port or settings.prefect_ui_port
    # (The UI server first: it must point Prefect's client at itself before Prefect is
    # imported, which the logging set-up does.)
    with _prefect_ui(settings, ui_port):
        _logging_of_the_server()
        uvicorn.run(
            create_app(settings),
            host=host or settings.api_host,
            port=port or settings.api_port,
            log_config=None,  # (set above: see _logging_of_the_server)
            log_level=log_level.value,
            proxy_headers=forwarded_allow_ips is not None,
            forwarded_allow_ips=forwarded_allow_ips,
            **server_options(settings),
        )


def _logging_of_the_server() -> None:
    """Prefect's logging set-up first, then the server's own loggers, without
    ``dictConfig``. Prefect configures logging once per process (in the API: at the first
    flow run) with a ``dictConfig`` that takes the ``uvicorn`` logger (WARNING, Prefect's
    handler) and resets ``uvicorn.access``: the access log went silent after the first job
    (issue 47). Run first, Prefect's set-ups after it are incremental (levels only), so the
    handlers set here stay. (uvicorn's own ``dictConfig`` is not used: it forgets Prefect's
    named handlers, and Prefect then starts over from scratch.)"""
    from prefect.logging.configuration import ensure_logging_setup
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    ensure_logging_setup()
    for name, stream, formatter in (
        ("uvicorn", sys.stderr, DefaultFormatter("%(levelprefix)s %(message)s")),
        (
            "uvicorn.access",
            sys.stdout,
            AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'),
        ),
    ):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)


@contextlib.contextmanager
def _prefect_ui(settings: Settings, port: int | None) -> Iterator[None]:
    """The Prefect UI server while the API serves, when asked for (see runners/prefect_ui).

    While it runs, SIGTERM ends the API as Ctrl-C does: uvicorn raises the signal again once
    it has shut down, which (default handler) killed the process before it could stop the
    Prefect server it started."""
    if port is None:
        yield
        return
    from verimail.runners.prefect_ui import PrefectUIError, prefect_ui

    if settings.runner != "local" or os.environ.get("PREFECT_API_URL"):
        typer.echo(
            "--prefect-ui-port: this process reports to the Prefect server of PREFECT_API_URL; "
            "the UI is that server's.",
            err=True,
        )
        raise typer.Exit(2)
    typer.echo(f"Starting the Prefect UI on 127.0.0.1:{port}…", err=True)
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(prefect_ui(port, settings.data_dir))
        except PrefectUIError as exc:
            typer.echo(f"The Prefect UI could not start: {exc}.", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"Prefect UI: {server.url}", err=True)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            yield
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
