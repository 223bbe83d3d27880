"""The ``verimail`` command (Typer + Rich).

Each area keeps its commands beside its code (``testbed/cli.py``, ...) and is wired here,
so this module stays a table of contents.
"""

from __future__ import annotations

import typer
from rich.console import Console

from verimail import API_VERSION, __version__

app = typer.Typer(
    name="verimail",
    help="Email verification service: verify addresses, run jobs, serve the API.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.command()
def version() -> None:
    """Print the package and API versions."""
    console.print(f"verimail {__version__} (API {API_VERSION})")


def _register() -> None:
    """Attach the sub-command groups of each area (imported lazily to keep start-up fast)."""
    from verimail.api.dashboard.cli import set_password_command
    from verimail.api.demo import demo_command
    from verimail.api.serve import serve_command
    from verimail.flows.cli import bulk_command, deploy_command, find_command, history_app
    from verimail.store.cli import accounts_app, credits_app, keys_app
    from verimail.tasks.cli_verify import verify_command
    from verimail.testbed.cli import app as testbed_app

    app.add_typer(testbed_app, name="testbed")
    app.command("verify")(verify_command)
    app.command("find")(find_command)
    app.command("serve")(serve_command)
    app.command("demo")(demo_command)
    accounts_app.command("set-password")(set_password_command)
    app.add_typer(accounts_app, name="accounts")
    app.add_typer(keys_app, name="keys")
    app.add_typer(credits_app, name="credits")
    app.command("bulk")(bulk_command)
    app.add_typer(history_app, name="history")
    app.command("deploy")(deploy_command)


def main() -> None:
    """Console-script entry point."""
    _register()
    app()
