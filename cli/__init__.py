"""The ``verimail`` command (Typer + Rich).

Every command lives in a module of this folder (``cli/verify.py``, ``cli/jobs.py``, ...;
the testbed, a component of its own, keeps ``testbed/cli.py``) and is wired here, so this
module stays a table of contents. ``--help`` imports every command module, so they import
the settings, the store, the engine, Prefect and Polars inside the commands, never at the
top (``tests/test_cli_help.py`` checks ``sys.modules``; docs/cli.md has the figures).
"""

from __future__ import annotations

import typer
from pydantic_core import ValidationError  # (pydantic's own, without loading pydantic)
from rich.console import Console

from verimail import API_VERSION, __version__
from verimail.cli.output import plain_help

app = typer.Typer(
    name="verimail",
    help="Email verification service: verify addresses, run jobs, serve the API.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
plain_help()


@app.command()
def version() -> None:
    """Print the package and API versions."""
    console.print(f"verimail {__version__} (API {API_VERSION})")


def _register() -> None:
    """Attach the sub-command groups of each area (imported lazily to keep start-up fast)."""
    from verimail.cli.accounts import accounts_app, credits_app, keys_app
    from verimail.cli.demo import demo_command
    from verimail.cli.doctor import doctor_command
    from verimail.cli.history import history_app
    from verimail.cli.jobs import bulk_command, deploy_command, find_command, retry_command
    from verimail.cli.passwords import set_password_command
    from verimail.cli.serve import serve_command
    from verimail.cli.verify import verify_command
    from verimail.cli.worker import worker_command
    from verimail.testbed.cli import app as testbed_app

    app.add_typer(testbed_app, name="testbed")
    app.command("verify")(verify_command)
    app.command("find")(find_command)
    app.command("serve")(serve_command)
    app.command("demo")(demo_command)
    app.command("doctor")(doctor_command)
    accounts_app.command("set-password")(set_password_command)
    app.add_typer(accounts_app, name="accounts")
    app.add_typer(keys_app, name="keys")
    app.add_typer(credits_app, name="credits")
    app.command("bulk")(bulk_command)
    app.command("retry")(retry_command)
    app.add_typer(history_app, name="history")
    app.command("deploy")(deploy_command)
    app.command("worker")(worker_command)


def settings_problems(exc: ValidationError) -> list[str]:
    """One line per bad ``VERIMAIL_*`` value, named as it is set (not as a Python field);
    a value refused several ways (a union such as IPv4 or IPv6) is one line. A secret's
    value (a proxy URL holds a password) is never quoted back."""
    from verimail.config import Settings

    found: dict[str, tuple[list[str], str]] = {}
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = "VERIMAIL_" + field.upper() if field else "settings"
        given = error.get("input")
        secret = field in Settings.model_fields and "SecretStr" in str(
            Settings.model_fields[field].annotation
        )
        quotable = isinstance(given, str | int | float) and not secret
        shown = f" (got {given!r})" if quotable else ""
        messages, _ = found.setdefault(name, ([], shown))
        if error["msg"] not in messages:
            messages.append(error["msg"])
    return [f"{name}: {'; '.join(msgs)}{shown}" for name, (msgs, shown) in found.items()]


def main() -> None:
    """Console-script entry point. A bad setting is a usage error (exit 2), not a traceback."""
    _register()
    try:
        app()
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        err = Console(stderr=True)
        err.print("Invalid settings (environment or .env):", style="bold red", highlight=False)
        for line in settings_problems(exc):
            err.print(f"  {line}", markup=False, highlight=False)
        raise SystemExit(2) from None
    except Exception as exc:
        problem = database_problem(exc)
        if problem is None:
            raise
        line, code = problem
        Console(stderr=True).print(f"error: {line}", markup=False, highlight=False)
        raise SystemExit(code) from None


def database_problem(exc: BaseException) -> tuple[str, int] | None:
    """(one line, exit code) for a database that cannot be used, else None: a URL SQLAlchemy
    cannot read is a usage error (2), a database that does not answer a failure (1). Either
    was a traceback of some 400 lines from every command that opens the store."""
    import sys

    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import make_url

    from verimail.config import get_settings

    try:
        url = make_url(get_settings().database_url).render_as_string(hide_password=True)
    except Exception:
        url = "VERIMAIL_DATABASE_URL"
    if isinstance(exc, sa_exc.ArgumentError):
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"VERIMAIL_DATABASE_URL {url!r} cannot be used: {first}", 2
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated is False:
        cause = str(exc.orig).strip().splitlines() if exc.orig is not None else []
        return f"cannot use the database {url}: {cause[0] if cause else exc}", 1
    return None
