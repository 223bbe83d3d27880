"""``verimail accounts set-password --account N``: give an account a dashboard password.

Accounts made with ``verimail accounts create`` (operators' ``--admin`` accounts among them)
have no password, so they cannot log in to the dashboard until an operator sets one here.
The password is asked for twice without echo (or read from ``VERIMAIL_NEW_PASSWORD`` for
scripts); it never appears in the shell history. Setting it signs the account's browsers out.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from verimail.schemas.limits import MAX_INT

console = Console()
err_console = Console(stderr=True)


def set_password_command(
    account_id: Annotated[
        int,
        typer.Option(
            "--account", "-a", "--id", min=1, max=MAX_INT, help="Account id (--id: the old name)."
        ),
    ],
    password: Annotated[
        str | None,
        typer.Option(
            envvar="VERIMAIL_NEW_PASSWORD",
            help="Asked for when not given (or set VERIMAIL_NEW_PASSWORD).",
        ),
    ] = None,
) -> None:
    """Set the dashboard password of an account (it needs an email to log in with)."""
    # Imported here, not at the top: ``verimail --help`` loads this module too.
    from verimail.api.dashboard.security import hash_password_sync, password_problem
    from verimail.config import get_settings
    from verimail.store import accounts as acc
    from verimail.store.db import init_store

    store = init_store(get_settings())
    try:
        # The account first: asking for a password twice, then saying there is no such
        # account (or none with an email to log in with), wasted the operator's typing.
        account = acc.get_account(store.engine, account_id)
        if account is None:
            err_console.print(f"[red]error:[/red] no account {account_id}", highlight=False)
            raise typer.Exit(code=1)
        if not account.email:
            err_console.print(
                f"[red]error:[/red] account {account_id} has no email to log in with; "
                "create accounts for the dashboard with --email",
                highlight=False,
            )
            raise typer.Exit(code=1)
        if password is None:
            password = typer.prompt(
                "New dashboard password", hide_input=True, confirmation_prompt=True
            )
        problem = password_problem(password)
        if problem is not None:
            err_console.print(Text.assemble(("error: ", "red"), problem), highlight=False)
            raise typer.Exit(code=1)
        acc.set_password_hash(store.engine, account_id, hash_password_sync(password))
    finally:
        store.close()
    console.print(Text(f"Account {account_id} ({account.email}) can now log in to the dashboard."))
