"""Every ``verimail`` help page, walked in-process: flags show no value type, arguments are
named one way (upper case), and nothing points at documents outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
import typer
from typer.testing import CliRunner

from verimail import cli

REPO = Path(__file__).resolve().parent.parent


def _app() -> typer.Typer:
    if not cli.app.registered_groups:  # (main() registers them; once per process)
        cli._register()
    return cli.app


def _command_paths() -> list[list[str]]:
    """Every command and group, as the words that reach it (``["keys", "revoke"]``)."""
    root = typer.main.get_command(_app())
    paths: list[list[str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return paths


def test_every_help_page_names_arguments_one_way_and_flags_without_a_type():
    paths = _command_paths()
    assert ["history", "query"] in paths and ["testbed", "up"] in paths
    accounts = [
        "accounts set",
        "accounts set-password",
        "keys create",
        "keys list",
        "credits grant",
    ]
    for path in paths:
        # (a fixed wide terminal: nothing below depends on how Rich wraps)
        result = CliRunner().invoke(_app(), [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        page = result.output
        assert "<bool>" not in page, (path, page)
        assert "../shared" not in page and "SPEC §" not in page, (path, page)
        usage = next(line for line in page.splitlines() if "Usage:" in line)
        words = usage.split("[OPTIONS]", 1)[1].split() if "[OPTIONS]" in usage else []
        for word in words:
            name = word.strip("[]{}.")
            if name in ("COMMAND", "ARGS"):
                continue
            assert re.fullmatch(r"[A-Z][A-Z_]*", name), (path, usage)
            assert not word.startswith("{"), (path, usage)
        if " ".join(path) in accounts:  # (one name for the account everywhere)
            assert "--account" in page, (path, page)


def test_make_demo_takes_a_port():
    run = subprocess.run(
        ["make", "-n", "demo", "PORT=8123"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "verimail demo --port 8123" in run.stdout
