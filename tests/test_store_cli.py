"""The operator commands (accounts, keys, credits) through typer's CliRunner."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from cli_helpers import folded, run_verimail
from typer.testing import CliRunner

from verimail.cli.accounts import accounts_app, credits_app, keys_app
from verimail.config import get_settings
from verimail.store import accounts as acc
from verimail.store.db import init_store
from verimail.store.testing import temporary_database_url

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
KEY_RE = re.compile(r"vm_[A-Za-z0-9_-]{40,}")

app = typer.Typer()
app.add_typer(accounts_app, name="accounts")
app.add_typer(keys_app, name="keys")
app.add_typer(credits_app, name="credits")


@pytest.fixture(params=BACKENDS)
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Point the CLI's settings at a throw-away database."""
    with temporary_database_url(request.param, tmp_path) as url:
        monkeypatch.setenv("VERIMAIL_DATABASE_URL", url)
        monkeypatch.setenv("VERIMAIL_DATA_DIR", str(tmp_path / "data"))
        get_settings.cache_clear()
        try:
            yield url
        finally:
            get_settings.cache_clear()


def run(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_key_is_printed_once_then_only_its_prefix(database_url: str) -> None:
    out = run("accounts", "create", "--plan", "starter", "--no-finder", "--email", "a@x.test")
    keys = KEY_RE.findall(out)
    assert len(keys) == 1, out
    raw_key = keys[0]
    assert "shown only this once" in out

    store = init_store(get_settings())
    try:
        account = acc.authenticate(store.engine, raw_key)
        assert account is not None
        assert (account.plan, account.finder_enabled, account.email) == (
            "starter",
            False,
            "a@x.test",
        )
        [info] = acc.list_keys(store.engine, account.id)
    finally:
        store.close()

    listing = run("keys", "list", "--account", str(account.id))
    assert info.prefix in listing
    assert raw_key not in listing and not KEY_RE.search(listing)
    assert "active" in listing

    accounts_listing = run("accounts", "list")
    assert "a@x.test" in accounts_listing and "starter" in accounts_listing
    assert raw_key not in accounts_listing


def test_keys_create_and_revoke(database_url: str) -> None:
    run("accounts", "create")
    out = run("keys", "create", "--account", "1", "--name", "ci")
    [raw_key] = KEY_RE.findall(out)
    store = init_store(get_settings())
    try:
        assert acc.authenticate(store.engine, raw_key) is not None
        key_id = next(k.id for k in acc.list_keys(store.engine, 1) if k.name == "ci")
        run("keys", "revoke", "--account", "1", str(key_id))
        assert acc.authenticate(store.engine, raw_key) is None
    finally:
        store.close()
    assert "revoked" in run("keys", "list", "--account", "1")

    again = CliRunner().invoke(app, ["keys", "revoke", "--account", "1", str(key_id)])
    assert again.exit_code == 1 and "no active key" in folded(again.output)
    missing = CliRunner().invoke(app, ["keys", "create", "--account", "99"])
    assert missing.exit_code == 1 and "no account 99" in folded(missing.output)


def test_accounts_set_and_credits(database_url: str) -> None:
    run("accounts", "create", "--plan", "free")
    assert "plan pro, finder off" in run(
        "accounts", "set", "--account", "1", "--plan", "pro", "--no-finder"
    )
    bad = CliRunner().invoke(app, ["accounts", "set", "--id", "1", "--plan", "gold"])
    assert bad.exit_code == 1 and "unknown plan" in folded(bad.output)
    nothing = CliRunner().invoke(app, ["accounts", "set", "--id", "1"])
    assert nothing.exit_code == 1

    assert "balance 10350" in run(
        "credits", "grant", "--account", "1", "250", "--reason", "invoice 7"
    )  # 100 signup + 250 granted + 10,000 Pro allowance
    shown = run("credits", "show", "--account", "1")
    assert "350 prepaid" in shown and "10000 of 10000 left" in shown
    assert "invoice 7" in shown and "+250" in shown and "signup" in shown
    zero = CliRunner().invoke(app, ["credits", "grant", "--account", "1", "0"])
    assert zero.exit_code != 0


def test_stored_text_is_shown_as_typed_never_as_markup(database_url: str) -> None:
    """An email, a key name or a ledger reason holding Rich markup or an emoji code is
    printed as stored: it crashed ``accounts list`` (``[/]``: a closing tag with nothing to
    close) or was changed (``:x:`` became an emoji, ``[bold]`` vanished)."""
    run("accounts", "create", "--email", "a[/]b@x.test", "--key-name", "[bold]k:x:")
    run("credits", "grant", "--account", "1", "5", "--reason", "[/x] ok :x: [red]r")
    listed = run("accounts", "list")
    assert "a[/]b@x.t" in listed and "❌" not in listed  # (folded at 80 columns)
    keys = run("keys", "list", "--account", "1")
    assert "[bold]k:x:" in keys
    ledger = run("credits", "show", "--account", "1")
    assert "[/x]" in ledger and ":x:" in ledger and "[red]r" in ledger and "❌" not in ledger


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "list", "--account", "99999999999999999999"],
        ["keys", "revoke", "--account", "1", "99999999999999999999"],
        ["credits", "grant", "--account", "1", "99999999999999999999"],
        ["credits", "show", "--account", "0"],
        ["accounts", "set", "--id", "99999999999999999999", "--plan", "pro"],
        ["accounts", "list", "--limit", "-1"],
    ],
    ids=["keys-list", "keys-revoke", "grant", "show-0", "accounts-set", "negative-limit"],
)
def test_numbers_out_of_range_are_a_usage_error(database_url: str, args: list[str]) -> None:
    """An id or amount no column can hold is refused by the command line itself (exit 2,
    "Invalid value" and the bound), not a traceback from the database driver."""
    run("accounts", "create", "--plan", "free")
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in folded(result.output) and "Traceback" not in result.output


def test_bad_input_is_refused_before_anything_is_written(database_url: str) -> None:
    """On PostgreSQL a key name too long for its column failed after the account had been
    created (an account without a key, and a traceback); a grant past the largest balance
    was a traceback; an address differing from another only in case made an account the
    dashboard could never sign in to."""

    def refused(*args: str) -> str:
        result = CliRunner().invoke(app, list(args), terminal_width=200)
        assert result.exit_code == 1, result.output
        assert "error:" in folded(result.output) and "Traceback" not in result.output
        return result.output

    assert "key name" in refused("accounts", "create", "--key-name", "k" * 150)
    assert "--email" in refused("accounts", "create", "--email", "x" * 400 + "@example.com")
    assert "--email" in refused("accounts", "create", "--email", "not an address")
    run("accounts", "create", "--email", "Ann@Example.com")
    assert "exists already" in refused("accounts", "create", "--email", "ann@example.com")
    assert "key name" in refused("keys", "create", "--account", "1", "--name", "k" * 101)
    assert "would pass" in refused("credits", "grant", "--account", "1", str(2**31 - 1))
    assert [a.email for a in acc.list_accounts(_engine())] == ["Ann@Example.com"]
    assert len(acc.list_keys(_engine(), 1)) == 1


def _engine():  # type: ignore[no-untyped-def]
    return init_store(get_settings()).engine


@pytest.mark.parametrize("port", ["0", "99999"])
def test_serve_refuses_a_port_that_does_not_exist(port: str, tmp_path: Path) -> None:
    """--port 99999 was bound as 34463 (mod 65536) while the log said 99999."""
    env = {"PATH": "/usr/bin:/bin", "VERIMAIL_DATA_DIR": str(tmp_path)}
    result = run_verimail(["serve", "--port", port], env)
    assert result.returncode == 2 and "Invalid value" in folded(result.stderr), result.stderr


def test_accounts_list_never_breaks_an_address(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns the address was folded mid-word over several lines; now it stays whole
    on one line (a table when one fits, else one block per account). Rich sizes its output
    by COLUMNS when it does not write to a terminal, so the width is fixed here."""
    monkeypatch.setenv("COLUMNS", "80")
    long = "maria.gonzalez-fernandez@subsidiary.example-company.test"
    run("accounts", "create", "--email", long, "--plan", "enterprise")
    run("accounts", "create", "--email", "bo@x.test")
    listed = run("accounts", "list").splitlines()
    assert any(long in line for line in listed), listed
    assert any("bo@x.test" in line for line in listed), listed
    assert any("enterprise" in line for line in listed) and not any("…" in x for x in listed)
