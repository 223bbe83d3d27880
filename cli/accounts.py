"""Operator commands for accounts, API keys and credits (wired into ``verimail`` by
``cli/__init__.py``).

    verimail accounts create --plan starter [--finder/--no-finder] [--email E] [--admin]
    verimail accounts list
    verimail accounts set --account N [--plan P] [--finder/--no-finder]
    verimail keys create --account N [--name X]
    verimail keys list --account N
    verimail keys revoke --account N KEY_ID
    verimail credits grant --account N AMOUNT [--reason R]
    verimail credits show --account N [--limit 20]

They act on the database of ``VERIMAIL_DATABASE_URL`` (default: SQLite under the data dir),
migrating it first like the API does. A raw API key is printed exactly once, at creation;
afterwards only its prefix is ever shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from verimail.cli.output import print_table
from verimail.schemas.limits import MAX_EMAIL_LENGTH, MAX_INT
from verimail.store.plans import PLAN_NAMES, UnknownPlan, get_plan

if TYPE_CHECKING:
    from verimail.store.db import Store

# The store (SQLAlchemy, Alembic) is imported by the commands that open it, not here:
# ``verimail --help`` loads every command module (tests/test_cli_help.py).

accounts_app = typer.Typer(help="Create, list and change accounts.", no_args_is_help=True)
keys_app = typer.Typer(help="Issue, list and revoke API keys.", no_args_is_help=True)
credits_app = typer.Typer(help="Grant credits and show balances.", no_args_is_help=True)

# Both resolve sys.stdout/sys.stderr at print time, so typer's CliRunner captures them.
console = Console()
err_console = Console(stderr=True)

AccountOpt = Annotated[int, typer.Option("--account", "-a", min=1, max=MAX_INT, help="Account id.")]
PlanHelp = f"Plan: {', '.join(PLAN_NAMES)}."


@contextmanager
def _store() -> Iterator[Store]:
    from verimail.config import get_settings
    from verimail.store.db import init_store

    store = init_store(get_settings())
    try:
        yield store
    finally:
        store.close()


def _check_key_name(name: str) -> None:
    """Checked before anything is written: on PostgreSQL a name too long for its column
    failed only after the account had been created, leaving it without a key."""
    from verimail.store import accounts as acc

    if problem := acc.key_name_problem(name):
        raise _fail(problem)


def _fail(message: str) -> typer.Exit:
    err_console.print(Text.assemble(("error: ", "red"), message), highlight=False)
    return typer.Exit(code=1)


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def _print_new_key(raw_key: str, account_id: int, key_id: int) -> None:
    # The key goes on a line of its own, outside any box, so it copies cleanly at any width.
    console.print(f"New API key [bold]{key_id}[/bold] of account {account_id}:")
    console.print(raw_key, highlight=False, markup=False, soft_wrap=True)
    console.print(
        Panel.fit("Store it now: it is shown only this once and cannot be recovered."),
        style="yellow",
    )


def _check_plan(plan: str) -> None:
    try:
        get_plan(plan)
    except UnknownPlan as exc:
        raise _fail(str(exc)) from None


# --- accounts ----------------------------------------------------------------------------


@accounts_app.command("create")
def accounts_create(
    plan: Annotated[str, typer.Option(help=PlanHelp)] = "free",
    finder: Annotated[bool, typer.Option("--finder/--no-finder", help="Email Finder.")] = True,
    email: Annotated[str | None, typer.Option(help="Contact/sign-in address.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Operator account.")] = False,
    key_name: Annotated[str, typer.Option(help="Name of the first API key.")] = "default",
) -> None:
    """Create an account (with signup credits) and its first API key."""
    from sqlalchemy.exc import IntegrityError

    from verimail.store import accounts as acc
    from verimail.store import billing

    _check_plan(plan)
    _check_key_name(key_name)
    email = (email or "").strip() or None
    if email is not None and ("@" not in email or len(email) > MAX_EMAIL_LENGTH):
        raise _fail(f"--email must be an email address of at most {MAX_EMAIL_LENGTH} characters")
    with _store() as store:
        # (in any letter case: the dashboard's sign-in would find the other account first)
        if email is not None and acc.email_taken(store.engine, email):
            raise _fail(f"an account with email {email!r} exists already")
        try:
            account = acc.create_account(
                store.engine,
                store.settings,
                plan=plan,
                finder_enabled=finder,
                email=email,
                is_admin=admin,
            )
        except IntegrityError:
            raise _fail(f"an account with email {email!r} exists already") from None
        raw_key, info = acc.create_api_key(store.engine, account.id, key_name)
        balance = billing.balance(store.engine, account.id)
    console.print(
        f"Created account [bold]{account.id}[/bold] on plan {account.plan}, finder "
        f"{'on' if account.finder_enabled else 'off'}, {balance.prepaid} prepaid credits."
    )
    _print_new_key(raw_key, account.id, info.id)


@accounts_app.command("list")
def accounts_list(
    limit: Annotated[int, typer.Option(min=0, max=MAX_INT, help="Most accounts to show.")] = 100,
    offset: Annotated[int, typer.Option(min=0, max=MAX_INT, help="Accounts to skip.")] = 0,
) -> None:
    """List accounts with their plan and balance."""
    from verimail.store import accounts as acc
    from verimail.store import billing

    with _store() as store:
        rows = [
            (a, billing.balance(store.engine, a.id))
            for a in acc.list_accounts(store.engine, limit, offset)
        ]
    # An address is never broken over lines ("ali" + "ce@acme.test" was copied as two
    # words): on a terminal too narrow for the table, one block per account.
    columns = ["id", "email", "plan", "finder", "admin", "prepaid", "allowance left", "created"]
    print_table(
        console,
        columns,
        [
            [
                str(account.id),
                account.email or "—",
                account.plan,
                "on" if account.finder_enabled else "off",
                "yes" if account.is_admin else "",
                str(bal.prepaid),
                "—" if bal.allowance is None else f"{bal.allowance_remaining}/{bal.allowance}",
                _when(account.created_at),
            ]
            for account, bal in rows
        ],
    )


@accounts_app.command("set")
def accounts_set(
    account_id: Annotated[
        int,
        typer.Option(
            "--account", "-a", "--id", min=1, max=MAX_INT, help="Account id (--id: the old name)."
        ),
    ],
    plan: Annotated[str | None, typer.Option(help=PlanHelp)] = None,
    finder: Annotated[
        bool | None, typer.Option("--finder/--no-finder", help="Email Finder.")
    ] = None,
) -> None:
    """Change an account's plan and/or Email Finder access."""
    from verimail.store import accounts as acc

    if plan is None and finder is None:
        raise _fail("nothing to change: give --plan and/or --finder/--no-finder")
    if plan is not None:
        _check_plan(plan)
    with _store() as store:
        account = acc.get_account(store.engine, account_id)
        if account is None:
            raise _fail(f"no account {account_id}")
        if plan is not None:
            account = acc.set_plan(store.engine, account_id, plan) or account
        if finder is not None:
            account = acc.set_finder(store.engine, account_id, finder) or account
    console.print(
        f"Account {account.id}: plan {account.plan}, finder "
        f"{'on' if account.finder_enabled else 'off'}."
    )


# --- keys --------------------------------------------------------------------------------


@keys_app.command("create")
def keys_create(
    account: AccountOpt,
    name: Annotated[str, typer.Option(help="A label for the key.")] = "default",
) -> None:
    """Issue a new API key (printed once)."""
    from verimail.store import accounts as acc
    from verimail.store.billing import AccountNotFound

    _check_key_name(name)
    with _store() as store:
        try:
            raw_key, info = acc.create_api_key(store.engine, account, name)
        except AccountNotFound as exc:
            raise _fail(str(exc)) from None
    _print_new_key(raw_key, account, info.id)


@keys_app.command("list")
def keys_list(account: AccountOpt) -> None:
    """List an account's keys by prefix (the keys themselves are not stored)."""
    from verimail.store import accounts as acc

    with _store() as store:
        if acc.get_account(store.engine, account) is None:
            raise _fail(f"no account {account}")
        keys = acc.list_keys(store.engine, account)
    table = Table("id", "name", "prefix", "created", "last used", "status")
    table.columns[1].overflow = "fold"
    for key in keys:
        table.add_row(
            str(key.id),
            Text(key.name),
            f"{key.prefix}…",
            _when(key.created_at),
            _when(key.last_used_at),
            "active" if key.active else f"revoked {_when(key.revoked_at)}",
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    account: AccountOpt,
    key_id: Annotated[
        int, typer.Argument(metavar="KEY_ID", min=1, max=MAX_INT, help="Key id (see `keys list`).")
    ],
) -> None:
    """Revoke a key; requests with it fail with 401 from now on."""
    from verimail.store import accounts as acc

    with _store() as store:
        revoked = acc.revoke_key(store.engine, account, key_id)
    if not revoked:
        raise _fail(f"account {account} has no active key {key_id}")
    console.print(f"Revoked key {key_id} of account {account}.")


# --- credits -----------------------------------------------------------------------------


@credits_app.command("grant")
def credits_grant(
    account: AccountOpt,
    amount: Annotated[
        int, typer.Argument(metavar="AMOUNT", min=1, max=MAX_INT, help="Prepaid credits to add.")
    ],
    reason: Annotated[str, typer.Option(help="Why (kept in the ledger).")] = "operator grant",
) -> None:
    """Add prepaid credits (they never expire)."""
    from verimail.store.billing import AccountNotFound, grant

    with _store() as store:
        try:
            bal = grant(store.engine, account, amount, reason=reason)
        except (AccountNotFound, ValueError) as exc:
            raise _fail(str(exc)) from None
    console.print(f"Granted {amount} credits to account {account}; balance {bal.total}.")


@credits_app.command("show")
def credits_show(
    account: AccountOpt,
    limit: Annotated[int, typer.Option(min=0, max=MAX_INT, help="Ledger rows to show.")] = 20,
) -> None:
    """Show an account's balance and its most recent ledger rows."""
    from verimail.store import billing
    from verimail.store.billing import AccountNotFound, ledger

    with _store() as store:
        try:
            bal = billing.balance(store.engine, account)
        except AccountNotFound as exc:
            raise _fail(str(exc)) from None
        entries = ledger(store.engine, account, limit=limit)
    allowance = (
        "none"
        if bal.allowance is None
        else f"{bal.allowance_remaining} of {bal.allowance} left, resets "
        f"{_when(bal.period_resets_at)}"
    )
    console.print(
        f"Account {account}: [bold]{bal.total}[/bold] credits "
        f"({bal.prepaid} prepaid; allowance {allowance})."
    )
    table = Table("id", "when", "delta", "kind", "source", "balance", "reference", "reason")
    for column in table.columns[6:]:
        column.overflow = "fold"
    for e in entries:
        table.add_row(
            str(e.id),
            _when(e.created_at),
            f"{e.delta:+d}",
            e.kind,
            e.source,
            str(e.balance_after),
            Text(e.reference or ""),
            Text(e.reason),
        )
    console.print(table)
