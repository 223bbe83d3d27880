"""``verimail serve``: the API under uvicorn, settings from the environment (``VERIMAIL_*``)."""

from __future__ import annotations

from enum import StrEnum

import typer

from verimail.config import get_settings


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
) -> None:
    """Serve the HTTP API (one process; run several behind a proxy with PostgreSQL + Redis)."""
    import uvicorn

    from verimail.api.app import create_app
    from verimail.api.http_edge import server_options

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
    uvicorn.run(
        create_app(settings),
        host=host or settings.api_host,
        port=port or settings.api_port,
        log_level=log_level.value,
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips,
        **server_options(settings),
    )
